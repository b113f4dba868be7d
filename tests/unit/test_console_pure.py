"""The console's pure parts: sessions and CSRF tokens (guard), and the lag heatmap (history)."""

from __future__ import annotations

from scheduler.console.guard import SESSION_S, Guard
from scheduler.console.history import LagHistory, level

TOKEN = "0123456789abcdef-token"


def test_a_session_needs_the_token_a_valid_name_and_actions_on():
    g = Guard(TOKEN, allow_actions=True)
    assert g.login("wrong", "alice", 0) is None
    assert g.login(TOKEN, "alice smith", 0) is None  # a name that would break log lines
    cookie = g.login(TOKEN, "alice", 1000)
    assert cookie is not None and TOKEN not in cookie
    assert g.who(cookie, 1000) == "alice"
    assert g.who(cookie, 1000 + SESSION_S) is None  # expired
    assert g.who(cookie.replace("alice", "admin"), 1000) is None  # forged name
    assert Guard(TOKEN, allow_actions=False).login(TOKEN, "alice", 0) is None
    assert Guard(None, allow_actions=True).allow_actions is False
    # Another console process (another key) does not accept this cookie.
    assert Guard(TOKEN, allow_actions=True).who(cookie, 1000) is None


def test_a_bearer_token_names_the_script_or_api():
    g = Guard(TOKEN, allow_actions=True)
    assert g.bearer(f"Bearer {TOKEN}", "deploy-bot") == "deploy-bot"
    assert g.bearer(f"bearer {TOKEN}", "bad name") == "api" and g.bearer(f"Bearer {TOKEN}", None) == "api"
    assert g.bearer("Bearer wrong", "x") is None and g.bearer(TOKEN, None) is None
    assert g.bearer(None, None) is None
    assert Guard(TOKEN, allow_actions=False).bearer(f"Bearer {TOKEN}", None) is None


def test_csrf_tokens_belong_to_one_session():
    g = Guard(TOKEN, allow_actions=True)
    a, b = g.login(TOKEN, "alice", 0), g.login(TOKEN, "bob", 0)
    assert a and b
    assert g.check(a, g.csrf(a), 1) == "alice"
    assert g.check(a, g.csrf(b), 1) is None
    assert g.check(None, g.csrf(a), 1) is None and g.check(a, "", 1) is None


def test_the_heatmap_folds_shards_into_rows_of_their_worst_lag():
    h = LagHistory(window_s=90, step_s=30)  # keeps 3 samples
    for t in range(4):
        h.add(t * 30.0, {s: float(s * 10 + t) for s in range(8)})
    heat = h.heatmap(max_rows=3)
    assert heat.times_s == [30.0, 60.0, 90.0]
    assert [label for label, _ in heat.rows] == ["0-2", "3-5", "6-7"]
    assert heat.rows[0][1] == [21.0, 22.0, 23.0]  # shard 2 is the worst of 0-2
    assert LagHistory().heatmap().rows == []
    assert [level(x, 60) for x in (0, 69.9, 70, 119, 120, 359, 360)] == [0, 0, 1, 1, 2, 2, 3]
    assert level(15, 10) == 0 and level(20, 10) == 1


def test_the_token_comes_from_its_file_first_and_must_be_long(tmp_path):
    import pytest

    from scheduler.errors import ConfigError
    from scheduler.settings import console_token

    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    both = {"SCHEDULER_CONSOLE_TOKEN_FILE": str(f), "SCHEDULER_CONSOLE_TOKEN": "x" * 20}
    assert console_token(both) == TOKEN
    assert console_token({"SCHEDULER_CONSOLE_TOKEN": "y" * 16}) == "y" * 16
    assert console_token({}) is None
    with pytest.raises(ConfigError, match="at least 16"):
        console_token({"SCHEDULER_CONSOLE_TOKEN": "short"})
    with pytest.raises(ConfigError, match="cannot read SCHEDULER_CONSOLE_TOKEN_FILE"):
        console_token({"SCHEDULER_CONSOLE_TOKEN_FILE": str(tmp_path / "missing")})
