"""``--handler`` and ``--app`` specs that are wrong: one ``ConfigError`` line each, never
an "unexpected" error, and no handler that would fail every job is accepted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.errors import ConfigError
from scheduler.runtime.handlers import load_app, load_object


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on sys.path holding the modules a user might give."""
    files = {
        "hh_boom.py": "raise RuntimeError('boom at import ' + 'x' * 500)\n",
        "hh_exits.py": "import sys\nsys.exit(3)\n",
        "hh_missing_dep.py": "import hh_no_such_dependency\n",
        "hh_handlers.py": textwrap.dedent("""
            def none(): ...
            def two(job, other): ...
            def one(job): ...
            def defaults(job, other=1): ...
            def star(*args): ...
            def keyword_only(*, job): ...
            NOT_CALLABLE = 3
            class Callable:
                def __call__(self, job): ...
            instance = Callable()
        """),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in files:
        monkeypatch.delitem(sys.modules, name.removesuffix(".py"), raising=False)
    return tmp_path


@pytest.mark.parametrize(("spec", "says"), [
    ("../etc:passwd", "module:attribute"), ("json", "module:attribute"), (":f", "module:attribute"),
    ("json:", "module:attribute"), ("json:a b", "module:attribute"), (".json:dumps", "module:attribute"),
    ("json..x:f", "module:attribute"), ("js\x00on:f", "module:attribute"),
    ("hh_no_such_module:f", "no module named 'hh_no_such_module'"),
    ("json.nope:f", "no module named 'json.nope'"),
    ("hh_boom:f", "raised RuntimeError: 'boom at import"),
    ("hh_exits:f", "raised SystemExit"),
    ("hh_missing_dep:f", "raised ModuleNotFoundError"),
    ("hh_handlers:nope", "has no attribute 'nope'"),
    ("hh_handlers:NOT_CALLABLE", "not callable"),
    ("hh_handlers:none", "one argument"),
    ("hh_handlers:two", "one argument"),
    ("hh_handlers:keyword_only", "one argument"),
])
def test_bad_handler_specs_are_one_config_error_line(user_modules, spec, says):
    with pytest.raises(ConfigError) as err:
        load_app(handler=spec)
    message = str(err.value)
    assert says in message and "\n" not in message
    assert len(message) < 500  # the module's own message is cut
    assert err.value.__cause__ is None and (err.value.__context__ is None or err.value.__suppress_context__)


@pytest.mark.parametrize("spec", ["hh_handlers:one", "hh_handlers:defaults", "hh_handlers:star",
                                  "hh_handlers:instance", "json:dumps", "scheduler:log_job"])
def test_handlers_taking_the_job_are_accepted(user_modules, spec):
    assert load_app(handler=spec).fallback is not None


def test_an_uninspectable_callable_is_let_through(user_modules):
    assert load_app(handler="builtins:print").fallback is not None


def test_the_traceback_of_an_import_error_only_with_debug(user_modules, monkeypatch, capsys):
    with pytest.raises(ConfigError):
        load_object("hh_boom:f")
    assert "Traceback" not in capsys.readouterr().err
    monkeypatch.setenv("SCHEDULER_DEBUG", "1")
    monkeypatch.delitem(sys.modules, "hh_boom", raising=False)
    with pytest.raises(ConfigError):
        load_object("hh_boom:f")
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.fuzz
@given(st.text(alphabet=st.sampled_from("./:_ \x00é-aZ0"), max_size=16))
def test_any_handler_path_raises_only_config_error(spec):
    # Only names that cannot exist, or the standard library's harmless "json": no user code.
    spec = spec.replace("a", "hh_fuzz_absent").replace("Z", "json")
    try:
        load_object(spec)
    except ConfigError as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize(("spec", "says"), [("../etc:passwd", "module:attribute"),
                                            ("hh_boom:f", "raised RuntimeError")])
def test_run_reports_a_bad_handler_in_one_line(user_modules, tmp_path, spec, says):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
    env.update(SCHEDULER_STORE=f"sqlite:///{tmp_path}/s.db", PYTHONPATH=str(user_modules))
    res = subprocess.run([sys.executable, "-m", "scheduler", "run", "--handler", spec,
                          "--metrics-address", "off"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=60)
    assert res.returncode == 1, res.stderr
    assert says in res.stderr and "unexpected" not in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
