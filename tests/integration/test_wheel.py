"""The built wheel is the product: installed with pip into a fresh virtualenv, and run from
a directory that is not the checkout (PYTHONPATH unset), every command works with what the
wheel carries. An editable install hides a file the wheel lacks, or a process that imports
the checkout instead of the installed package; this module does not.

The wheel is built once (``python -m build``: an sdist, then the wheel from that sdist) and
installed once. Only the embedded store (sqlite://) is used. ``run --processes N`` needs a
ZooKeeper fleet; here the members are pointed at a port where nothing listens, which checks
what comes before ZooKeeper (each member imports the installed package and opens the store),
not the fleet itself (tests/integration/test_processes.py runs that on the real servers).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.procs import ROOT, free_port, wait_until

pytestmark = pytest.mark.slow

# What pip and a build need from the registry (dependencies, setuptools) comes through pip's
# cache after the first run; a cold cache on a slow link can take a few minutes.
INSTALL_TIMEOUT_S = 600


@dataclass(frozen=True)
class Installed:
    venv: Path
    wheel: Path
    sdist: Path
    work: Path  # a fresh directory to run from: not the checkout
    env: dict[str, str]

    def run(self, *args: str, cwd: Path | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.venv / "bin" / "scheduler"), *args], cwd=cwd or self.work,
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str, log: Path, cwd: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with open(log, "ab") as f:
            return subprocess.Popen([str(self.venv / "bin" / "scheduler"), *args], cwd=cwd or self.work,
                                    env={**self.env, **(env or {})}, stdout=f, stderr=subprocess.STDOUT)

    def pip(self, *args: str) -> None:
        res = subprocess.run([str(self.venv / "bin" / "python"), "-m", "pip", "install", "-q",
                              "--disable-pip-version-check", *args], cwd=self.work, env=self.env,
                             capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        assert res.returncode == 0, res.stdout + res.stderr


def clean_env() -> dict[str, str]:
    """This process's environment without what would let the checkout or the test's own
    virtualenv leak in (PYTHONPATH, an active virtualenv) or hide the checkout problem
    (PYTHONSAFEPATH), and without scheduler settings (a store or coordinator of the caller)."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONSTARTUP", "VIRTUAL_ENV",
            "__PYVENV_LAUNCHER__"}
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SCHEDULER_")}


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel built from this checkout, installed alone (no extra) in a new virtualenv."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    env = clean_env()
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], env=env,
                           capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel, sdist = next(dist.glob("scheduler-*.whl")), next(dist.glob("scheduler-*.tar.gz"))
    venv = base / "venv"
    # venv uses the base interpreter, so nothing of the test's own virtualenv is visible.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], env=env, check=True, timeout=120)
    work = base / "work"
    work.mkdir()
    inst = Installed(venv, wheel, sdist, work, env)
    inst.pip(str(wheel))
    return inst


@pytest.fixture(scope="session")
def with_console(installed: Installed) -> Installed:
    """The same virtualenv with the console extra added."""
    installed.pip(f"{installed.wheel}[console]")
    return installed


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; any still running at its end are killed."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.terminate()
    return proc.wait(timeout=60)


HANDLER = '''\
import os

import scheduler


def handle(job):
    line = f"{job.job_id} {scheduler.__file__}\\n"
    fd = os.open(os.environ["WHEEL_TEST_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
'''


def test_the_distributions_pass_twine_check_and_carry_every_data_file(installed):
    res = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(installed.wheel),
                          str(installed.sdist)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    data = [p for p in (ROOT / "cql").rglob("*") if p.suffix in (".cql", ".sql")]
    expected = {f"scheduler/cql/{p.relative_to(ROOT / 'cql').as_posix()}" for p in data}
    console = ROOT / "scheduler" / "console"
    expected |= {f"scheduler/console/{p.relative_to(console).as_posix()}"
                 for d in ("templates", "static") for p in (console / d).iterdir() if p.is_file()}
    assert {"cql/sqlite", "cql/versions"} <= {p.parent.relative_to(ROOT).as_posix() for p in data}
    assert expected <= names, sorted(expected - names)
    assert not [n for n in names if n.startswith("cql/")], "the CQL files belong inside the package"


def test_version_from_the_installed_wheel(installed):
    from scheduler import __version__

    res = installed.run("--version")
    assert (res.returncode, res.stdout, res.stderr) == (0, f"scheduler {__version__}\n", "")
    probe = installed.venv / "bin" / "python"
    out = subprocess.run([str(probe), "-c", "import importlib.metadata as m, scheduler; "
                          "print(scheduler.__version__, m.version('scheduler'), scheduler.__file__)"],
                         cwd=installed.work, env=installed.env, capture_output=True, text=True, timeout=60)
    package, metadata, where = out.stdout.split()
    assert package == metadata == __version__
    assert Path(where).is_relative_to(installed.venv), where  # the installed copy, not the checkout


def test_demo_runs_with_no_set_up(installed):
    res = installed.run("demo", "--jobs", "200", "--seconds", "2s", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads(res.stdout)
    assert summary["fired"] == summary["scheduled"] == 200
    assert summary["lost"] == summary["early"] == summary["duplicates"] == 0


def test_schema_apply_and_a_poller_firing_on_the_embedded_store(installed, procs, tmp_path):
    store = f"sqlite:///{tmp_path}/store.db"
    applied = installed.run("schema", "apply", "--store", store)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    (installed.work / "wheel_jobs.py").write_text(HANDLER)
    start = datetime.now(UTC) + timedelta(seconds=1)
    jobs = tmp_path / "jobs.jsonl"
    ids = [f"w{i}" for i in range(20)]
    jobs.write_text("".join(json.dumps({"id": job_id, "kind": "k",
                                        "at": (start + timedelta(milliseconds=100 * i)).isoformat()}) + "\n"
                            for i, job_id in enumerate(ids)))
    loaded = installed.run("load", str(jobs), "--store", store)
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    out, port = tmp_path / "fired", free_port()
    poller = installed.start("run", "--handler", "wheel_jobs:handle", "--coordinator", "local",
                             "--store", store, "--metrics-address", f"127.0.0.1:{port}",
                             log=tmp_path / "run.log", env={"WHEEL_TEST_OUT": str(out)})
    procs.append(poller)

    def fired() -> dict[str, str]:
        lines = out.read_text().splitlines() if out.exists() else []
        return dict(line.split(" ", 1) for line in lines)

    wait_until(lambda: set(ids) <= set(fired()) or poller.poll() is not None, 60, "every job fired")
    assert poller.poll() is None, (tmp_path / "run.log").read_text()
    assert all(Path(p).is_relative_to(installed.venv) for p in fired().values()), fired()
    wait_until(lambda: b"scheduler_" in http_get(f"http://127.0.0.1:{port}/metrics")[1], 30, "metrics")
    assert stop(poller) == 0, (tmp_path / "run.log").read_text()


def test_processes_members_run_the_installed_package_from_a_source_tree(installed, procs, tmp_path):
    """From a directory that holds the package's source tree (a checkout, or the image's
    /app where the Dockerfile copies scheduler/ and installs it), ``python -m scheduler``
    would import ./scheduler, which has no scheduler.cql: every member failed to open the
    store. Each member must run the installed package, as the supervisor does. Without
    ZooKeeper the members get as far as connecting to it (after the store), and exit 1."""
    src = tmp_path / "app"
    shutil.copytree(ROOT / "scheduler", src / "scheduler", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "wheel_jobs.py").write_text(HANDLER)
    store = f"sqlite:///{tmp_path}/store.db"
    assert installed.run("schema", "apply", "--store", store, cwd=src).returncode == 0
    nobody = f"zookeeper://127.0.0.1:{free_port()}/wheel-test"  # nothing listens there
    log = tmp_path / "sup.log"
    sup = installed.start("run", "--handler", "wheel_jobs:handle", "--processes", "2",
                          "--coordinator", nobody, "--store", store, "--metrics-address", "off",
                          log=log, cwd=src)
    procs.append(sup)
    # The members give up on ZooKeeper after its connection timeout (15 s), and the
    # supervisor stops with them.
    code = sup.wait(timeout=120)
    text = log.read_text()
    assert "ModuleNotFoundError" not in text, text
    assert text.count("cannot reach ZooKeeper") == 2, text
    assert code == 1 and "supervisor stopped: exit 1" in text, text


def test_console_answers_from_the_installed_wheel(with_console, procs, tmp_path):
    store = f"sqlite:///{tmp_path}/store.db"
    assert with_console.run("schema", "apply", "--store", store).returncode == 0
    port = free_port()
    log = tmp_path / "console.log"
    console = with_console.start("console", "--store", store, "--address", f"127.0.0.1:{port}", log=log)
    procs.append(console)
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_get(f"{base}/")[0] == 200 or console.poll() is not None, 60, "the console")
    assert console.poll() is None, log.read_text()
    for page in ("/fleet", "/dead", "/schedules"):  # templates from the wheel
        status, body = http_get(base + page)
        assert status == 200 and b"<html" in body.lower(), (page, status, body[:300])
    status, body = http_get(f"{base}/static/htmx.min.js")  # static files from the wheel
    assert status == 200 and body
    assert stop(console) == 0, log.read_text()


def test_exporter_answers_from_the_installed_wheel(installed, procs, tmp_path):
    store = f"sqlite:///{tmp_path}/store.db"
    assert installed.run("schema", "apply", "--store", store).returncode == 0
    port = free_port()
    log = tmp_path / "exporter.log"
    exporter = installed.start("exporter", "--store", store, "--address", f"127.0.0.1:{port}",
                               "--interval", "1s", log=log)
    procs.append(exporter)
    url = f"http://127.0.0.1:{port}/metrics"
    wait_until(lambda: b"scheduler_" in http_get(url)[1] or exporter.poll() is not None, 60, "the exporter")
    assert exporter.poll() is None, log.read_text()
    assert stop(exporter) == 0, log.read_text()
