"""The signature checks that docs/http-targets.md gives receivers, in Python, Go and Node,
accept what a poller signs and refuse the rest: a changed body, another secret, a
timestamp out of the 5-minute window, a malformed header. The Go and Node ones run when
their tool is installed (ops/setup installs neither)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from scheduler.domain.httptarget import sign

DOC = Path(__file__).resolve().parents[2] / "docs" / "http-targets.md"
SECRET = "0123456789abcdef0123456789abcdef"
NOW = 1_800_000_000


def snippet(language: str) -> str:
    """The one fenced block of ``language`` in the page's Signatures section."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Signatures"):text.index("## Metrics")]
    blocks = re.findall(rf"^```{language}\n(.*?)^```", section, re.M | re.S)
    assert len(blocks) == 1, f"{len(blocks)} {language} blocks in the Signatures section"
    return str(blocks[0])


def cases() -> list[dict[str, Any]]:
    """(header, body, now, expected) cases, signed by the poller's own ``sign``."""
    body = '{"invoice":7,"note":"é"}'.encode()
    good = sign(SECRET.encode(), NOW, body)
    out = [(good, body, NOW, True), (good, body, NOW + 299, True), (good, body, NOW - 299, True),
           (sign(SECRET.encode(), NOW, b""), b"", NOW, True),
           (f"v1=00ff,{good},v1=zz", body, NOW, True),  # one v1 of several matches
           (good, body + b" ", NOW, False), (good, body, NOW + 301, False), (good, body, NOW - 301, False),
           (sign(b"another-secret-entirely-0000", NOW, body), body, NOW, False),
           (good.replace("v1=", "v0="), body, NOW, False), (f"t={NOW}", body, NOW, False),
           ("", body, NOW, False),
           (f"t=x{NOW},v1=00", body, NOW, False), (good.upper(), body, NOW, False)]
    return [{"header": h, "body": b.hex(), "now": n, "expected": e} for h, b, n, e in out]


def test_the_python_snippet():
    namespace: dict[str, Any] = {}
    exec(compile(snippet("python"), str(DOC), "exec"), namespace)  # the page's own code
    for case in cases():
        got = namespace["verify_signature"](SECRET, case["header"], bytes.fromhex(case["body"]), case["now"])
        assert got is case["expected"], case


def run_cases(cmd: list[str], cwd: Path) -> list[bool]:
    done = subprocess.run(cmd, cwd=cwd, input=json.dumps(cases()), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return [bool(v) for v in json.loads(done.stdout)]


GO_MAIN = """package webhook

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"
)

func TestCases(t *testing.T) {
	var cases []struct {
		Header string `json:"header"`
		Body   string `json:"body"`
		Now    int64  `json:"now"`
	}
	data, err := os.ReadFile("cases.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	out := []bool{}
	for _, c := range cases {
		body, _ := hex.DecodeString(c.Body)
		out = append(out, VerifySignature([]byte("%s"), c.Header, body, time.Unix(c.Now, 0)))
	}
	result, _ := json.Marshal(out)
	fmt.Println("RESULT", string(result))
}
"""


def test_the_go_snippet(tmp_path):
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed")
    (tmp_path / "go.mod").write_text("module webhook\n\ngo 1.21\n")
    (tmp_path / "verify.go").write_text(snippet("go"))
    (tmp_path / "verify_test.go").write_text(GO_MAIN % SECRET)
    (tmp_path / "cases.json").write_text(json.dumps(cases()))
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off", "GOCACHE": str(tmp_path / "cache"),
           "GOPATH": str(tmp_path / "gopath")}
    done = subprocess.run([go, "test", "-count=1", "-v", "."], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    [line] = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.startswith("RESULT ")]
    assert json.loads(line.removeprefix("RESULT ")) == [c["expected"] for c in cases()]


NODE_MAIN = """const { verifySignature } = require("./verify.js");
let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", () => {
  const out = JSON.parse(input).map((c) =>
    verifySignature("%s", c.header, Buffer.from(c.body, "hex"), c.now));
  console.log(JSON.stringify(out));
});
"""


def test_the_node_snippet(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    (tmp_path / "verify.js").write_text(snippet("javascript"))
    (tmp_path / "main.js").write_text(NODE_MAIN % SECRET)
    assert run_cases([node, "main.js"], tmp_path) == [c["expected"] for c in cases()]
