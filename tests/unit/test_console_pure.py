"""The console's pure parts: sessions and CSRF tokens (guard), the lag heatmap (history),
status banners (protect), lateness (pages) and the audit gate (auditrun)."""

from __future__ import annotations

import pytest

from scheduler.console.auditrun import AuditRuns
from scheduler.console.guard import SESSION_S, Guard, same
from scheduler.console.history import LagHistory, level
from scheduler.console.pages import lateness
from scheduler.console.protect import BANNERS, banner
from scheduler.domain.model import Job, Status
from scheduler.observe.audit import AuditReport

TOKEN = "0123456789abcdef-token"


def test_a_session_needs_the_token_a_valid_name_and_actions_on():
    g = Guard(TOKEN, allow_actions=True)
    assert g.login("wrong", "alice", 0) is None
    assert g.login(TOKEN, "alice smith", 0) is None  # a name that would break log lines
    assert g.login(TOKEN, "alice\n", 0) is None  # nor a trailing newline
    cookie = g.login(TOKEN, "alice", 1000)
    assert cookie is not None and TOKEN not in cookie and "alice" not in cookie
    assert g.who(cookie, 1000) == "alice"
    assert g.who(cookie[:-1] + ("A" if cookie[-1] != "A" else "B"), 1000) is None  # forged
    assert g.who(cookie, 1000 + SESSION_S) is None  # expired
    assert Guard(TOKEN, allow_actions=False).login(TOKEN, "alice", 0) is None
    assert Guard(None, allow_actions=True).allow_actions is False
    # Another console process does not know this session.
    assert Guard(TOKEN, allow_actions=True).who(g.login(TOKEN, "alice", 1000), 1000) is None


def test_signing_out_ends_the_session_on_the_server():
    g = Guard(TOKEN, allow_actions=True)
    cookie = g.login(TOKEN, "alice", 0)
    other = g.login(TOKEN, "alice", 0)
    assert cookie and other and cookie != other
    csrf = g.csrf(cookie)
    assert g.logout(cookie) == "alice"
    assert g.who(cookie, 1) is None and g.check(cookie, csrf, 1) is None  # a copy is dead too
    assert g.logout(cookie) is None and g.logout(None) is None
    assert g.who(other, 1) == "alice"  # another sign-in of the same person lives on


def test_sessions_are_bounded_the_oldest_goes_first():
    g = Guard(TOKEN, allow_actions=True, max_sessions=3)
    cookies = [g.login(TOKEN, f"u{i}", i) for i in range(4)]
    assert [g.who(c, 10) for c in cookies] == [None, "u1", "u2", "u3"]


@pytest.mark.parametrize("hostile", ["é", "\u2603" * 64, "\x00", "\udcff", "ascii-but-wrong"])
def test_secrets_compare_as_bytes_whatever_characters_they_hold(hostile: str):
    """hmac.compare_digest on str raises TypeError for non-ASCII text (a 500 in the
    console): a cookie, CSRF field or bearer header of any characters is just refused."""
    g = Guard(TOKEN, allow_actions=True)
    cookie = g.login(TOKEN, "alice", 0)
    assert cookie
    assert g.login(hostile, "alice", 0) is None
    assert g.bearer(f"Bearer {hostile}", None) is None
    assert g.who(hostile, 1) is None
    assert g.check(cookie, hostile, 1) is None
    assert g.check(hostile, g.csrf(cookie), 1) is None
    assert same(hostile, hostile) and not same(hostile, TOKEN)


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


def test_banners_come_from_fixed_codes_only():
    assert banner("replayed", "2") == "Replayed 2 dead letters: they fire again now."
    assert banner("cancelled", None) == "Cancelled the job: it will not fire."
    assert banner("<script>alert(1)</script>", None) == ""  # any other text shows nothing
    assert banner("cancelled the job; call +1 555 0100 now", None) == ""
    assert banner(None, None) == "" and banner("", "1") == ""
    for count in ("", "-1", "1e9", "\u0661", "1234567890", "2; rm"):  # not a plain count
        assert banner("refired", count) == "", count
    assert all(banner(code, "7") for code in BANNERS)


def _job(status: Status, due_ms: int, fired_ms: int | None) -> Job:
    return Job(job_id="j", kind="k", data=b"{}", data_json=True, due_ms=due_ms, fire_ms=due_ms,
               bucket=0, shard=0, status=status, fired_ms=fired_ms)


def test_lateness_is_shown_only_for_a_fire_at_or_after_its_due_time():
    now = 10_000_000_000
    assert lateness(_job(Status.FIRED, 1_000, 1_250), now) == (250, "late")
    assert lateness(_job(Status.FIRED, 1_000, 1_000), now) == (0, "late")
    # Replayed: pending again with a new due time, still holding the old fired time.
    replayed = _job(Status.PENDING, now + 60_000, now - 2_535_042_510)
    assert lateness(replayed, now) is None
    assert lateness(_job(Status.PENDING, now - 5_000, now - 2_535_042_510), now) == (5_000, "overdue")
    assert lateness(_job(Status.CANCELLED, now, now - 1), now) is None
    assert lateness(_job(Status.PENDING, now + 1, None), now) is None


def test_without_signing_in_the_audit_runs_at_most_once_a_minute_one_at_a_time():
    t = [0.0]
    ran: list[tuple[int, int]] = []

    def fake_audit(first: int, last: int) -> AuditReport:
        ran.append((first, last))
        return AuditReport(first // 1000, last // 1000)

    runs = AuditRuns(fake_audit, interval_s=60, monotonic=lambda: t[0])
    assert runs.run(0, 1000, None) is None and runs.last and runs.last.by == "anonymous"
    refused = runs.run(0, 2000, None)
    assert refused and "at most one audit a minute" in refused and len(ran) == 1
    assert runs.last.last_ms == 1000  # the last result stays to be seen
    assert runs.run(0, 3000, "alice") is None and runs.last.by == "alice"  # signed in: runs
    t[0] = 61.0
    assert runs.run(0, 4000, None) is None and len(ran) == 3
    # One at a time: a run while another is under way is refused, not queued.
    inner: list[str | None] = []

    def reentrant(first: int, last: int) -> AuditReport:
        inner.append(busy.run(first, last, "bob"))
        return AuditReport(0, 0)

    busy = AuditRuns(reentrant, monotonic=lambda: t[0])
    assert busy.run(0, 1, "alice") is None
    assert inner and inner[0] and "another audit is running" in inner[0]
