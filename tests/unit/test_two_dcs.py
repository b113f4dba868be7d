"""Two data centres without a server: the replication parser (property tests too), the DC
and write-consistency settings, how the URL's local_dc and a given DC combine, and the
levels and routing policy the Cassandra store chooses from them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

import scheduler.cli.main  # noqa: F401  (registers every command)
from scheduler.cli.common import app
from scheduler.domain.topology import (
    DC_NAME_RE,
    check_dc,
    parse_replication,
    parse_write_consistency,
    replication_cql,
)
from scheduler.errors import ConfigError
from scheduler.producer.client import Client
from scheduler.settings import Settings
from scheduler.store import open_store
from scheduler.store.cassandra.conf import CassandraUrl
from scheduler.store.cassandra.connect import check_dc_known, load_balancing
from scheduler.store.cassandra.store import CassandraStore

URL = "cassandra://127.0.0.1/ks"


def cli(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


# --- the replication setting --------------------------------------------------------------

@pytest.mark.parametrize(("spec", "cls", "factors"), [
    ("simple:3", "SimpleStrategy", {"replication_factor": 3}),
    ("simple", "SimpleStrategy", {"replication_factor": 1}),
    ("dc1:2,dc2:1", "NetworkTopologyStrategy", {"dc1": 2, "dc2": 1}),
    ("us-east-1:3", "NetworkTopologyStrategy", {"us-east-1": 3}),
    ("nts:dc1=3,dc2=2", "NetworkTopologyStrategy", {"dc1": 3, "dc2": 2}),
    ("nts:simple=1", "NetworkTopologyStrategy", {"simple": 1}),
])
def test_replication_forms(spec, cls, factors):
    assert parse_replication(spec) == (cls, factors)


def test_the_cql_map_of_two_dcs():
    assert replication_cql("dc1:2,dc2:1") == "{'class': 'NetworkTopologyStrategy', 'dc1': 2, 'dc2': 1}"
    assert replication_cql("simple:3") == "{'class': 'SimpleStrategy', 'replication_factor': 3}"


@pytest.mark.parametrize("spec", [
    "", "dc1", "dc1:", "dc1:0", "dc1:100", "dc1:2,", ",dc1:2", "dc1:2,dc1:1", "dc1:2;dc2:1", "dc1: 2",
    " dc1:2", "dc1:+2", "dc1:1_0", "dc1:\u0663", "dc'1:2", "dc1:2,dc2=1", "nts:dc1:2", "nts:", "simple:0",
    "simple:x", "simple:3,dc1:1", "d\u00e9:1", "dc1=2", "a" * 49 + ":1"])
def test_bad_replication_is_one_line_naming_the_forms(spec):
    with pytest.raises(ConfigError) as err:
        parse_replication(spec)
    text = str(err.value)
    assert text.startswith("--replication ") and "DC:RF" in text and "\n" not in text


REPLICATION_BITS = st.sampled_from(["simple", "nts", ":", "=", ",", "dc1", "dc2", "1", "2", "0", "99", "100",
                                    " ", "'", "\u0663", "_", "-", ".", "\n", "\x00", "é", "+"])


@pytest.mark.fuzz
@given(st.one_of(st.text(max_size=40), st.lists(REPLICATION_BITS, max_size=10).map("".join)))
@example("dc1:2,dc2:1")
@example("nts:dc1=1")
def test_replication_raises_only_config_error_and_what_it_accepts_is_safe_cql(spec):
    try:
        cls, factors = parse_replication(spec)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    cql = replication_cql(spec)
    # Nothing accepted can close the string literals it is written into.
    assert cql.count("'") == 4 + 2 * len(factors)
    assert all(1 <= rf <= 99 for rf in factors.values())
    assert cls == "SimpleStrategy" or all(DC_NAME_RE.match(dc) for dc in factors)


@pytest.mark.fuzz
@given(st.dictionaries(st.from_regex(DC_NAME_RE, fullmatch=True).filter(lambda d: d not in ("simple", "nts")),
                       st.integers(1, 99), min_size=1, max_size=4))
def test_every_dc_map_round_trips(factors):
    spec = ",".join(f"{dc}:{rf}" for dc, rf in factors.items())
    assert parse_replication(spec) == ("NetworkTopologyStrategy", factors)
    old = "nts:" + ",".join(f"{dc}={rf}" for dc, rf in factors.items())
    assert parse_replication(old) == ("NetworkTopologyStrategy", factors)


def test_schema_apply_refuses_bad_replication_before_opening_anything(tmp_path: Path):
    db = tmp_path / "s.db"
    res = cli("schema", "apply", "--store", f"sqlite:///{db}", "--replication", "dc1:2,dc1:1")
    assert res.exit_code == 1, res.output
    out = res.output
    assert out.count("\n") == 1 and out.startswith("error: --replication 'dc1:2,dc1:1'"), out
    assert not db.exists()


def test_schema_apply_accepts_two_dcs_on_the_embedded_store(tmp_path: Path):
    # The embedded store has one copy whatever the setting: accepted, nothing to replicate.
    res = cli("schema", "apply", "--store", f"sqlite:///{tmp_path}/s.db", "--replication", "dc1:2,dc2:1")
    assert res.exit_code == 0, res.output


# --- the DC and the write consistency -----------------------------------------------------

def test_the_dc_and_write_consistency_settings():
    s = Settings.from_env({"SCHEDULER_DC": "dc2", "SCHEDULER_WRITE_CONSISTENCY": " EACH_QUORUM"})
    assert (s.dc, s.write_consistency) == ("dc2", "each_quorum")
    assert (Settings.from_env({}).dc, Settings.from_env({}).write_consistency) == (None, None)


@pytest.mark.parametrize(("name", "value"), [
    ("SCHEDULER_DC", "dc 1"), ("SCHEDULER_DC", "dc'1"), ("SCHEDULER_DC", "\x1b[31m"),
    ("SCHEDULER_WRITE_CONSISTENCY", "quorum"), ("SCHEDULER_WRITE_CONSISTENCY", "all"),
    ("SCHEDULER_WRITE_CONSISTENCY", "local_serial")])
def test_bad_dc_or_consistency_settings_name_the_variable(name, value):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({name: value})
    assert str(err.value).startswith(name) and "\n" not in str(err.value) and "\x1b" not in str(err.value)


@given(st.text(max_size=60))
@pytest.mark.fuzz
def test_dc_and_consistency_parsers_raise_only_config_error(text):
    for parse in (lambda t: check_dc(t, "x"), lambda t: parse_write_consistency(t, "x")):
        try:
            parse(text)
        except ConfigError as exc:
            assert "\n" not in str(exc)


def test_no_dc_keeps_the_old_levels_but_fences_at_serial():
    cfg = CassandraUrl(URL)
    levels = (cfg.write_cl, cfg.read_cl, cfg.serial_cl)
    assert cfg.dc is None and levels == ("LOCAL_QUORUM", "LOCAL_QUORUM", "SERIAL")


@pytest.mark.parametrize(("url", "dc"), [(URL, "dc1"), (URL + "?local_dc=dc1", None),
                                         (URL + "?local_dc=dc1", "dc1")])
def test_a_dc_from_either_place_is_one_setting(url, dc):
    cfg = CassandraUrl(url, dc=dc)
    assert (cfg.dc, cfg.write_cl, cfg.read_cl, cfg.serial_cl) == ("dc1", "LOCAL_QUORUM", "LOCAL_QUORUM",
                                                                  "LOCAL_SERIAL")


def test_a_dc_given_twice_differently_is_refused():
    with pytest.raises(ConfigError, match=r"local_dc=dc1 .* says dc2"):
        CassandraUrl(URL + "?local_dc=dc1", dc="dc2")


def test_each_quorum_applies_to_writes_only():
    for cfg in (CassandraUrl(URL, dc="dc1", consistency="each_quorum"),
                CassandraUrl(URL + "?consistency=each_quorum&local_dc=dc1")):
        assert (cfg.write_cl, cfg.read_cl, cfg.serial_cl) == ("EACH_QUORUM", "LOCAL_QUORUM", "LOCAL_SERIAL")


@pytest.mark.parametrize(("url", "consistency", "message"), [
    (URL + "?consistency=local_quorum", "each_quorum", "consistency=local_quorum"),
    (URL + "?consistency=serial", None, "consistency='serial'"),
    (URL + "?consistency=any", None, "consistency='any'"),
    (URL, "quorum", "not a write consistency"),
    (URL + "?local_dc=dc%271", None, "local_dc"),
])
def test_bad_or_conflicting_levels_are_refused(url, consistency, message):
    with pytest.raises(ConfigError, match=message):
        CassandraUrl(url, consistency=consistency)


def test_the_routing_policy_is_token_aware_over_one_dc():
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    policy = load_balancing("dc2")
    assert isinstance(policy, TokenAwarePolicy)
    assert isinstance(policy._child_policy, DCAwareRoundRobinPolicy)
    assert policy._child_policy.local_dc == "dc2" and policy._child_policy.used_hosts_per_remote_dc == 0
    assert load_balancing(None)._child_policy.local_dc is None


def test_a_dc_the_cluster_does_not_have_is_refused():
    check_dc_known("dc1", {"dc1", "dc2"})
    check_dc_known(None, {"datacenter1"})
    with pytest.raises(ConfigError, match=r"no node in DC 'dc3' \(its DCs: dc1, dc2\)"):
        check_dc_known("dc3", {"dc1", "dc2", None})


def _levels(url: str, **given: Any) -> dict[str, tuple[Any, Any]]:
    """The levels the store gives a read, a write and a lightweight transaction."""
    store = object.__new__(CassandraStore)
    store.cfg = CassandraUrl(url, **given)
    out = {}
    for what, text in (("read", "SELECT x FROM t WHERE k = ?"), ("write", "INSERT INTO t (k) VALUES (?)"),
                       ("lwt", "UPDATE t SET x = ? WHERE k = ? IF e = ?")):
        stmt = SimpleNamespace(consistency_level=None, serial_consistency_level=None)
        store._set_levels(stmt, text, " IF " in text)
        out[what] = (stmt.consistency_level, stmt.serial_consistency_level)
    return out


def test_statement_levels_with_a_dc():
    from cassandra import ConsistencyLevel as CL

    assert _levels(URL, dc="dc1") == {"read": (CL.LOCAL_QUORUM, None), "write": (None, None),
                                      "lwt": (CL.LOCAL_QUORUM, CL.LOCAL_SERIAL)}
    # Writes take the session's default (EACH_QUORUM here); reads and fencing stay local.
    assert _levels(URL, dc="dc1", consistency="each_quorum") == _levels(URL, dc="dc1")
    assert _levels(URL)["lwt"] == (CL.LOCAL_QUORUM, CL.SERIAL)


# --- clients --------------------------------------------------------------------------------

def test_the_embedded_store_accepts_and_ignores_a_dc(tmp_path: Path):
    url = f"sqlite:///{tmp_path}/s.db"
    open_store(url).close()
    assert cli("schema", "apply", "--store", url).exit_code == 0
    with Client(url, dc="dc1", consistency="each_quorum") as client:
        assert client.meta.bucket_width_s == 60


def test_a_client_refuses_a_bad_dc_before_opening_anything(tmp_path: Path):
    with pytest.raises(ConfigError, match="dc= 'dc 1' is not a DC name"):
        Client(f"sqlite:///{tmp_path}/none.db", dc="dc 1")
    with pytest.raises(ConfigError, match="consistency= 'one' is not a write consistency"):
        Client(f"sqlite:///{tmp_path}/none.db", consistency="one")
    assert not (tmp_path / "none.db").exists()


def test_a_dc_with_a_store_object_is_refused(tmp_path: Path):
    url = f"sqlite:///{tmp_path}/s.db"
    assert cli("schema", "apply", "--store", url).exit_code == 0
    store = open_store(url)
    try:
        with pytest.raises(ConfigError, match="apply to a store the client opens"):
            Client(store, dc="dc1")
    finally:
        store.close()


def test_run_refuses_a_bad_dc_in_one_line(tmp_path: Path):
    res = cli("run", "--dc", "dc\x1b1", "--shards", "0", "--handler", "json:dumps",
              "--store", f"sqlite:///{tmp_path}/s.db")
    assert res.exit_code == 1, res.output
    assert res.output.count("\n") == 1 and res.output.startswith("error: --dc 'dc\\x1b1' is not a DC name")
