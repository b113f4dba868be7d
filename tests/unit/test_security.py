"""Security settings and error wording, without servers."""

from __future__ import annotations

import pytest

from scheduler.diagnose import explain_unauthorized
from scheduler.errors import ConfigError, PermissionDenied
from scheduler.fleet.zkconn import kazoo_client
from scheduler.security import Secret, ZkSecurity, is_loopback
from scheduler.settings import cassandra_security, zookeeper_security
from scheduler.store.cassandra.conf import CassandraUrl


def test_a_password_never_shows_in_a_repr_and_its_file_is_read_on_each_use(tmp_path):
    f = tmp_path / "pw"
    f.write_text("first-secret-value\n")
    sec = cassandra_security({"SCHEDULER_CASSANDRA_USER": "app", "SCHEDULER_CASSANDRA_PASSWORD_FILE": str(f)})
    assert "first-secret" not in repr(sec) and "first-secret" not in str(sec)
    assert sec.password is not None and sec.password.reveal("X") == "first-secret-value"
    f.write_text("rotated-secret-value\n")
    assert sec.password.reveal("X") == "rotated-secret-value"
    assert "inline-secret" not in repr(Secret(value="inline-secret"))


def test_settings_errors_name_the_setting(tmp_path):
    with pytest.raises(ConfigError, match="SCHEDULER_CASSANDRA_PASSWORD_FILE"):
        Secret(path=str(tmp_path / "missing")).reveal("SCHEDULER_CASSANDRA_PASSWORD_FILE")
    with pytest.raises(ConfigError, match="SCHEDULER_CASSANDRA_VERIFY_HOSTNAME"):
        cassandra_security({"SCHEDULER_CASSANDRA_CA": "/x", "SCHEDULER_CASSANDRA_VERIFY_HOSTNAME": "maybe"})
    with pytest.raises(ConfigError, match="TLS is off"):
        zookeeper_security({"SCHEDULER_ZK_CERT": "/c", "SCHEDULER_ZK_KEY": "/k"})
    with pytest.raises(ConfigError, match="no password"):
        cassandra_security({"SCHEDULER_CASSANDRA_USER": "app"}).auth_provider(None)
    with pytest.raises(ConfigError, match="SCHEDULER_CASSANDRA_CA"):
        cassandra_security({"SCHEDULER_CASSANDRA_CA": str(tmp_path / "none.pem")}).tls.context()  # type: ignore[union-attr]


def test_tls_is_on_with_a_ca_and_verifies_hostnames_by_default():
    assert cassandra_security({}).tls is None
    tls = cassandra_security({"SCHEDULER_CASSANDRA_TLS": "true"}).tls
    assert tls is not None and tls.verify_hostname and tls.ca is None
    ctx = tls.context()
    assert ctx.check_hostname
    off = zookeeper_security({"SCHEDULER_ZK_TLS": "1", "SCHEDULER_ZK_VERIFY_HOSTNAME": "false"})
    assert off.kazoo_args()["check_hostname"] is False


def test_a_password_in_the_store_url_is_refused_without_echoing_it():
    with pytest.raises(ConfigError) as err:
        CassandraUrl("cassandra://app:s3cret-in-url@localhost/ks")
    assert "s3cret" not in str(err.value)
    assert CassandraUrl("cassandra://app@localhost:9142/ks").user == "app"
    assert CassandraUrl("cassandra://localhost/ks").user is None


def test_digest_credentials_travel_in_clear_only_to_loopback():
    assert is_loopback("127.0.0.1:2181,localhost:2182") and not is_loopback("10.0.0.5:2181")
    with pytest.raises(ConfigError, match="clear text"):
        kazoo_client("10.0.0.5:2181", 5, "u:p", ZkSecurity())
    kazoo_client("127.0.0.1:2181", 5, "u:p", ZkSecurity()).close()


def test_a_missing_permission_names_it_and_the_role_to_use():
    err = explain_unauthorized("User reader has no MODIFY permission on <table ks.jobs> or any of its "
                               "parents")
    assert isinstance(err, PermissionDenied)
    assert "MODIFY" in str(err) and "app role" in str(err)
    err = explain_unauthorized("User app has no CREATE permission on <all keyspaces> or any of its parents")
    assert "admin role" in str(err)


def test_a_refused_login_is_retried_only_around_a_password_rotation(tmp_path):
    import os

    pw = tmp_path / "app.pw"
    pw.write_text("old\n")
    secret, naps = Secret(path=str(pw)), list[float]()
    assert secret.rotating("old")  # replaced just now: the server's cache may lag
    os.utime(pw, (1, 1))  # a file unchanged for ages: a wrong password, no wait past the gap
    assert not secret.rotating("old", gap_s=0.3, sleep=naps.append) and len(naps) == 3

    def rotate(_s: float) -> None:  # the file changes during the wait
        pw.write_text("new\n")
        os.utime(pw, (1, 1))

    assert secret.rotating("old", gap_s=1.0, sleep=rotate)
    assert not Secret(value="env").rotating("env")


def test_readers_get_read_only_acls_and_a_password_is_refused_as_a_reader_id():
    from kazoo.security import make_digest_acl_credential

    reader_id = make_digest_acl_credential("reader", "pw")
    sec = zookeeper_security({"SCHEDULER_ZK_READERS": f" {reader_id} "})
    own, read = sec.acl("app:secret") or []
    assert own.perms == 31 and read.perms == 1 and read.id.id == reader_id
    assert ZkSecurity().acl(None) is None
    with pytest.raises(ConfigError, match="not a digest id") as err:
        zookeeper_security({"SCHEDULER_ZK_READERS": "reader:plain-password"})
    assert "plain-password" not in str(err.value)


def test_the_role_setup_refuses_a_bad_password_without_echoing_it():
    """ops/secure_setup.py fills passwords into role statements; one that is not plain
    hex is refused, and the refusal names the field, never the value."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "ops" / "secure_setup.py"
    spec = importlib.util.spec_from_file_location("secure_setup", path)
    assert spec is not None and spec.loader is not None
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    assert "'0123abcd0123abcd'" in setup.cql("set_password", role="app", password="0123abcd0123abcd")
    with pytest.raises(SystemExit) as err:
        setup.cql("set_password", role="app", password="leaked-pass'word-value")
    assert "password" in str(err.value) and "leaked" not in str(err.value)


@pytest.mark.parametrize(("hosts", "want"), [
    ("zk1", ("zk1", 2181)), ("zk1:2281", ("zk1", 2281)), ("10.0.0.1,10.0.0.2:9", ("10.0.0.1", 2181)),
    ("[::1]", ("::1", 2181)), ("[::1]:2281,zk2", ("::1", 2281))])
def test_the_first_zookeeper_address_defaults_to_port_2181(hosts: str, want: tuple[str, int]):
    from scheduler.diagnose import first_address

    assert first_address(hosts) == want


@pytest.mark.parametrize("hosts", ["localhost", "[::1]", "h:port", ":2181", "h:99999"])
def test_the_plaintext_probe_answers_false_for_any_host_list_never_a_value_error(hosts: str):
    """A URL without a port (zookeeper://HOST/ROOT) gave 'unexpected ValueError'. Nothing
    listens on a TLS port here (a refused connection or a bad address: False)."""
    from scheduler.diagnose import probe_plain_is_tls

    assert probe_plain_is_tls(hosts, timeout_s=0.5) is False


SECRET_BYTES = b"Zq7-hunter2-Mv\xe9Qj-Kx9"
NEVER_SHOWN = ["Zq7", "hunter2", "Mv", "Qj", "Kx9", "xe9", "0xe9", "\xe9", "position", "byte"]


@pytest.mark.parametrize("setting", ["SCHEDULER_CONSOLE_TOKEN_FILE", "SCHEDULER_ZK_AUTH_FILE",
                                     "SCHEDULER_CASSANDRA_PASSWORD_FILE"])
def test_a_secret_file_not_utf8_is_a_config_error_showing_none_of_it(tmp_path, setting: str):
    from scheduler.settings import console_token, zookeeper_credentials

    f = tmp_path / "secret"
    f.write_bytes(SECRET_BYTES)
    env = {setting: str(f), "SCHEDULER_CASSANDRA_USER": "app"}
    read = {"SCHEDULER_CONSOLE_TOKEN_FILE": lambda: console_token(env),
            "SCHEDULER_ZK_AUTH_FILE": lambda: zookeeper_credentials(env),
            "SCHEDULER_CASSANDRA_PASSWORD_FILE":
                lambda: cassandra_security(env).password.reveal(setting)}[setting]  # type: ignore[union-attr]
    with pytest.raises(ConfigError) as caught:
        read()
    message = str(caught.value)
    assert setting in message and "not UTF-8" in message, message
    for piece in NEVER_SHOWN:
        assert piece not in message, (piece, message)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
