"""Input that used to escape the CLI's error contract as ``error: unexpected ...``: a
schedule id that is not UTF-8, and a Cassandra host name that does not resolve (no server
needed: ``.invalid`` never resolves, RFC 2606)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import scheduler.cli.main  # noqa: F401  (registers every command)
from scheduler.cli.common import app

LONE = "s\udcff"  # how Python reads the undecodable argv byte b"s\xff"


def cli(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


@pytest.mark.parametrize("args", [["get"], ["pause"], ["resume"], ["delete"],
                                  ["create", "--every", "5m", "--kind", "k"]])
def test_a_schedule_id_that_is_not_utf8_is_invalid_input(tmp_path: Path, args: list[str]) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    assert cli("schema", "apply", "--store", url).exit_code == 0
    res = cli("recurring", args[0], LONE, *args[1:], "--store", url)
    assert res.exit_code == 1, res.output
    assert res.output == "error: schedule id must be valid UTF-8 (it contains a lone surrogate)\n", \
        res.output


def test_an_unresolvable_cassandra_host_is_store_unavailable() -> None:
    res = cli("get", "x", "--store", "cassandra://nohost.invalid/ks",
              env={"SCHEDULER_STORE": None})
    out = res.output
    assert res.exit_code == 1, out
    assert out.count("\n") == 1 and "unexpected" not in out, out
    assert out.startswith("error: cannot resolve the Cassandra host name(s) nohost.invalid"), out
    assert "--store" in out


def test_load_reads_json_lines_whose_strings_hold_line_separators(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    assert cli("schema", "apply", "--store", url).exit_code == 0
    payload = {"text": "a\u2028b\u2029c\x85d"}
    lines = [json.dumps({"id": f"u{i}", "at": "2030-01-01T00:00:00Z", "kind": "k", "payload": payload},
                        ensure_ascii=False) for i in range(2)]
    (tmp_path / "jobs.jsonl").write_bytes(("\r\n".join(lines) + "\n").encode("utf-8"))
    res = cli("load", str(tmp_path / "jobs.jsonl"), "--json", "--store", url)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"loaded": 2}
    got = cli("get", "u1", "--json", "--store", url)
    assert json.loads(got.stdout)["payload"] == payload
