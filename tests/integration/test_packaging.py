"""The CQL files ship inside the wheel (not only visible from an editable checkout)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_wheel_contains_the_cql_files(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("scheduler-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"scheduler/cql/{p.relative_to(ROOT / 'cql')}" for p in (ROOT / "cql").rglob("*")
                if p.suffix in (".cql", ".sql")}
    assert expected and expected <= names, expected - names
    assert any(n.endswith("entry_points.txt") for n in names)
