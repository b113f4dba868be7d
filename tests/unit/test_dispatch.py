from __future__ import annotations

import pytest

from scheduler.domain.dispatch import App, RetryPolicy, run_handler
from scheduler.domain.model import Job
from scheduler.errors import ConfigError
from scheduler.runtime.handlers import load_app


def job(kind: str = "email", attempts: int = 0) -> Job:
    return Job(job_id="j", kind=kind, data=b"{}", data_json=True, due_ms=0, fire_ms=0, bucket=0,
               shard=0, attempts=attempts)


def test_backoff_doubles_is_capped_and_jittered():
    p = RetryPolicy(max_attempts=10, base_s=1, cap_s=10)
    assert [p.delay_ms(a, 0.999999) // 1000 for a in (1, 2, 3, 4, 5)] == [0, 1, 3, 7, 9]
    assert p.delay_ms(1, 0.0) == 500 and p.delay_ms(3, 0.0) == 2000
    assert p.delay_ms(20, 0.0) == 5000


def test_app_routes_by_kind_and_policies():
    app = App()
    seen = []

    @app.handler("email", max_attempts=2)
    def email(j):
        seen.append(j.job_id)
        raise RuntimeError("smtp down")

    out = run_handler(app, job(), lambda: 1000, lambda: 0.0)
    assert not out.ok and out.retry_at_ms == 1500 and out.error == "RuntimeError: smtp down"
    out = run_handler(app, job(attempts=1), lambda: 1000, lambda: 0.0)
    assert out.dead and out.retry_at_ms is None
    assert seen == ["j", "j"]
    unknown = run_handler(app, job("sms"), lambda: 0)
    assert unknown.dead and unknown.error == "no handler for kind 'sms'"


def test_function_handler_takes_every_kind():
    calls: list[Job] = []
    app = App.for_function(calls.append)
    assert run_handler(app, job("anything"), lambda: 0).ok
    assert calls[0].kind == "anything"


def test_loading_handlers():
    assert load_app(handler="json:dumps").fallback is not None
    with pytest.raises(ConfigError, match="exactly one"):
        load_app()
    with pytest.raises(ConfigError, match="cannot import"):
        load_app(handler="no_such_module_x:f")
    with pytest.raises(ConfigError, match="has no attribute"):
        load_app(handler="json:nope")
    with pytest.raises(ConfigError, match=r"not a scheduler\.App"):
        load_app(app="json:dumps")
    with pytest.raises(ConfigError, match="module:attribute"):
        load_app(handler="json")


def test_a_failed_outcome_holds_no_locals_of_any_frame_in_the_chain():
    import gc
    import weakref

    from scheduler.domain.dispatch import clear_locals

    class Big:
        pass

    refs = []

    def helper():
        held = Big()
        refs.append(weakref.ref(held))
        raise KeyError("missing")

    def handler():
        try:
            helper()
        except KeyError as e:
            raise RuntimeError("wrapped") from e

    try:
        handler()
    except RuntimeError as exc:
        caught = exc
    clear_locals(caught)
    gc.collect()
    assert refs[0]() is None  # the helper's local, reachable only through __cause__'s frames
