"""No module is over ~400 lines (import circles: test_layers.py, which counts every import)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "scheduler"
MAX_LINES = 400


def test_modules_read_in_one_sitting():
    long = {str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
