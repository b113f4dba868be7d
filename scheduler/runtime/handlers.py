"""Loading the handlers of ``--handler module:function`` and ``--app module:app``.

Not pure: loading imports user code, which may do anything while it is imported. So it
lives here, above the layers that only run handlers (``domain.dispatch`` holds the rules
and never imports a user's module). Every way a spec can be wrong is one ``ConfigError``
line saying what to fix: a CLI user's mistake, never an "unexpected" error.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import traceback
from typing import Any

from ..domain.dispatch import App
from ..errors import ConfigError
from ..settings import debug_enabled

# How much of a module's own error message (raised while imported) the line repeats.
IMPORT_ERROR_CHARS = 200


def _shown(spec: str) -> str:
    return repr(spec if len(spec) <= 120 else spec[:120] + "...")


def load_object(spec: str) -> Any:
    """Import ``module.sub:attr.sub`` and return the attribute. Raises ``ConfigError``
    (one line, nothing else) when the spec is not of that form (dotted Python names on
    both sides), the module is not found, importing it raised (its exception's type and
    message, cut to ``IMPORT_ERROR_CHARS``; the traceback on stderr only with
    ``SCHEDULER_DEBUG``), or the attribute is missing."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not all(p.isidentifier() for p in (*module_name.split("."), *attr.split("."))):
        raise ConfigError(f"{_shown(spec)} is not module:attribute with dotted Python names "
                          "(module.sub:attr, e.g. myapp.jobs:handle)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(missing + "."):
            raise ConfigError(f"cannot import {module_name!r} for {_shown(spec)}: no module named "
                              f"{missing!r} (run from the project's directory, or install it)") from None
        raise _import_failed(module_name, exc) from None
    except (Exception, SystemExit) as exc:  # the user's module failed while it ran
        raise _import_failed(module_name, exc) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{module_name!r} has no attribute {attr!r} (check the name after "
                              "':')") from None
        except Exception as exc:  # a module's __getattr__ may raise anything
            raise _import_failed(module_name, exc) from None
    return obj


def _import_failed(module_name: str, exc: BaseException) -> ConfigError:
    if debug_enabled():
        traceback.print_exception(exc, file=sys.stderr)
    message = " ".join(str(exc).split())
    if len(message) > IMPORT_ERROR_CHARS:
        message = message[:IMPORT_ERROR_CHARS] + "..."
    return ConfigError(f"importing {module_name!r} raised {type(exc).__name__}: {message!r} "
                       "(fix the module; SCHEDULER_DEBUG=1 shows the traceback)")


def check_handler(fn: Any, spec: str) -> None:
    """``ConfigError`` unless ``fn`` is callable with one positional argument (the job).
    A callable whose signature cannot be inspected (some built-ins) is let through."""
    if not callable(fn):
        raise ConfigError(f"{_shown(spec)} is a {type(fn).__name__}, not callable: name a function "
                          "taking the job")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(object())
    except TypeError:
        raise ConfigError(f"{_shown(spec)} cannot be called with one argument (the job): its "
                          f"signature is {signature}; write it as def handle(job): ...") from None


def load_app(handler: str | None = None, app: str | None = None) -> App:
    """The App for ``--handler module:function`` or ``--app module:app`` (exactly one).
    Raises ``ConfigError`` as ``load_object`` and ``check_handler`` do, and for an
    ``--app`` that is not a ``scheduler.App``."""
    if (handler is None) == (app is None):
        raise ConfigError("give exactly one of --handler module:function or --app module:app")
    if handler is not None:
        fn = load_object(handler)
        check_handler(fn, handler)
        return App.for_function(fn)
    obj = load_object(app or "")
    if not isinstance(obj, App):
        raise ConfigError(f"{app!r} is a {type(obj).__name__}, not a scheduler.App")
    return obj
