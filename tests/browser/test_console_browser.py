"""The web console in a real browser: Debian's Chromium through Selenium and
chromedriver (ops/setup installs both; a missing one fails in CI and skips elsewhere).

Each test runs on both stores. The store is filled by a short ``scheduler demo`` run,
plus dead letters and a recurring schedule; a ``scheduler run`` poller owns the shards
and ``scheduler console --allow-actions`` serves it. Screenshots of every page go to
``.data/artifacts/console`` (``$SCHEDULER_TEST_ARTIFACTS`` to change it).

The last test writes jobs, dead letters and schedules whose ids are attacks (quotes that
would close a JavaScript string, ``<script>``, ``</script>``, an ``onerror`` image), signs
in and clicks every action button on the pages that show them: each confirmation shows
the id as text, no script of the attacker runs (``window.__pwned`` stays unset, no
unexpected dialog), and the browser reports no Content-Security-Policy violation.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from scheduler import Client, Status
from scheduler.store import open_store
from tests.conftest import CASSANDRA_HOSTS, CASSANDRA_PORT, cassandra_url, require_server, require_tool
from tests.procs import ROOT, free_port, kill_all, start_poller, wait_until

TOKEN = "browser-test-console-token-0123"
ARTIFACTS = Path(os.environ.get("SCHEDULER_TEST_ARTIFACTS", ROOT / ".data" / "artifacts")) / "console"
PAGES = [("fleet", "/fleet"), ("bucket", "/buckets?at={bucket}&shard={shard}"), ("job", "/jobs?id=d1"),
         ("schedules", "/schedules"), ("dead", "/dead"), ("audit", "/audit?run=1"), ("login", "/login")]


@dataclass
class Console:
    url: str
    store_url: str
    base: str
    suffix: str  # of the screenshots' names: "" on the embedded store, "-cassandra"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module", params=["sqlite", "cassandra"])
def console(request: Any, tmp_path_factory: Any) -> Iterator[Console]:
    tmp = tmp_path_factory.mktemp("console")
    if request.param == "sqlite":
        store_url = f"sqlite:///{tmp}/store.db"
    else:
        require_server("Cassandra", CASSANDRA_HOSTS.split(",")[0], CASSANDRA_PORT, "ops/cassandra start")
        store_url = cassandra_url("console_" + uuid.uuid4().hex[:10])
    demo = subprocess.run([sys.executable, "-m", "scheduler", "demo", "--jobs", "300", "--seconds", "2",
                           "--store", store_url, "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert demo.returncode == 0, demo.stderr[-2000:]
    store = open_store(store_url)
    client = Client(store)
    now = datetime.now(UTC)
    for i in range(4):
        client.schedule(f"d{i}", now + timedelta(hours=1), "payment" if i % 2 else "email", {"n": i})
        store.record_dead(client.get(f"d{i}"), f"gateway answered HTTP 50{i}", client.clock.now_ms())
    client.recurring.create("settlement", kind="report", cron="0 3 * * *", tz="Europe/Lisbon")
    client.recurring.create("cache-refresh", kind="refresh", every="5m")
    job = client.get("d1")
    client.close()
    store.close()
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    poller = start_poller(store_url, tmp / "poller.out")
    with open(tmp / "console.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "console", "--store", store_url, "--allow-actions",
             "--address", f"127.0.0.1:{port}", "--sample-interval", "1"], cwd=ROOT, stdout=log, stderr=log,
            env={**os.environ, "SCHEDULER_CONSOLE_TOKEN_FILE": str(token_file)})
    try:
        wait_until(lambda: _listening(port) or proc.poll() is not None, 30, "the console to listen")
        assert proc.poll() is None, (tmp / "console.log").read_text()[-2000:]
        suffix = "" if request.param == "sqlite" else "-cassandra"
        yield Console(f"http://127.0.0.1:{port}", store_url, f"bucket={job.bucket}&shard={job.shard}", suffix)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        kill_all([poller])
        if request.param == "cassandra":
            admin = open_store(store_url)
            admin.session.execute(f"DROP KEYSPACE IF EXISTS {admin.keyspace}")  # type: ignore[attr-defined]
            admin.close()
        log_text = (tmp / "console.log").read_text()
        assert TOKEN not in log_text, "the token must never reach a log"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = require_tool("chromium", "chromium")
    driver_path = require_tool("chromedriver", "chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000",
                "--disable-gpu"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP violations are logged there
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    driver.set_page_load_timeout(30)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def _errors(browser: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".error")]


def _shot(browser: Any, name: str) -> None:
    browser.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def _csp_violations(browser: Any) -> list[str]:
    """The browser's log lines since the last call that report a refused script, style
    or frame (Chrome logs each Content-Security-Policy violation there)."""
    return [e["message"] for e in browser.get_log("browser")
            if "Content Security Policy" in e["message"] or "Refused to" in e["message"]]


def _sign_in(console: Console, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser.delete_all_cookies()
    browser.get(console.url + "/login")
    browser.find_element(By.NAME, "who").send_keys("alice")
    browser.find_element(By.NAME, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    WebDriverWait(browser, 10).until(ec.text_to_be_present_in_element((By.ID, "who"), "alice"))


def test_every_page_loads_and_the_fleet_page_refreshes_itself(console: Console, browser: Any):
    from selenium.webdriver.common.by import By

    for name, path in PAGES:
        browser.get(console.url + path.format(**dict(p.split("=") for p in console.base.split("&"))))
        assert not _errors(browser), (name, _errors(browser))
        assert browser.find_element(By.TAG_NAME, "h1").text, name
        _shot(browser, name + console.suffix)
    browser.get(console.url + "/schedules")
    assert {"settlement", "cache-refresh"} <= set(browser.find_element(By.ID, "schedules").text.split())
    # htmx swaps the fleet part in place every 10 s: the sample time moves on without a reload.
    browser.get(console.url + "/fleet")
    browser.execute_script("document.getElementById('fleet-live').dataset.mark = 'old'")
    first = browser.find_element(By.CSS_SELECTOR, "#fleet-live .meta").text
    wait_until(lambda: browser.execute_script(
        "return document.getElementById('fleet-live').dataset.mark") is None, 25, "htmx to refresh the fleet")
    assert browser.find_element(By.CSS_SELECTOR, "#fleet-live .meta").text != first
    assert "nobody" not in browser.find_element(By.ID, "pollers").text  # the poller owns every shard
    _shot(browser, "fleet" + console.suffix)
    # htmx and the console's script work under the CSP: nothing of ours was refused.
    assert _csp_violations(browser) == []


def test_actions_are_refused_without_the_token(console: Console, browser: Any):
    from selenium.webdriver.common.by import By

    browser.delete_all_cookies()
    browser.get(console.url + "/dead")
    assert not browser.find_elements(By.CSS_SELECTOR, "input[type=checkbox]")  # no action offered
    # A forged form post (what a page elsewhere could send): refused, nothing changes.
    browser.execute_script("""
        const f = document.createElement('form'); f.method = 'post'; f.action = '/dead/replay';
        for (const [k, v] of [['job_id', 'd0'], ['csrf', 'guess']]) {
          const i = document.createElement('input'); i.name = k; i.value = v; f.appendChild(i); }
        document.body.appendChild(f); f.submit();""")
    wait_until(lambda: bool(_errors(browser)), 10, "the refusal page")
    assert "sign in" in _errors(browser)[0]
    browser.get(console.url + "/login")
    browser.find_element(By.NAME, "who").send_keys("mallory")
    browser.find_element(By.NAME, "token").send_keys("not-the-token-at-all")
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    wait_until(lambda: bool(_errors(browser)), 10, "the refused sign-in")
    _shot(browser, "refused" + console.suffix)
    store = open_store(console.store_url)
    try:
        assert "d0" in {d.job_id for d in store.dead_letters()}
    finally:
        store.close()


def test_a_replay_through_the_form_reaches_the_store(console: Console, browser: Any):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    _sign_in(console, browser)
    browser.get(console.url + "/dead?kind=payment")
    browser.find_element(By.ID, "tick-d1").click()
    browser.find_element(By.ID, "replay-button").click()
    WebDriverWait(browser, 5).until(ec.alert_is_present())
    browser.switch_to.alert.accept()  # the confirmation a destructive action asks for
    WebDriverWait(browser, 10).until(ec.presence_of_element_located((By.ID, "done")))
    assert browser.find_element(By.ID, "done").text == "Replayed 1 dead letters: they fire again now."
    _shot(browser, "replayed" + console.suffix)
    store = open_store(console.store_url)
    try:
        assert {d.job_id for d in store.dead_letters()} == {"d0", "d2", "d3"}
        replayed = store.get("d1")
        assert replayed is not None and replayed.status is Status.PENDING and replayed.attempts == 0
    finally:
        store.close()


def _untouched(browser: Any, where: str) -> None:
    """No script of an attacker ran on this page: no dialog is open (execute_script
    would raise UnexpectedAlertPresentException), ``window.__pwned`` is unset and the
    title is the console's."""
    pwned, title = browser.execute_script("return [window.__pwned === undefined ? null : "
                                          "String(window.__pwned), document.title]")
    assert pwned is None, (where, pwned)
    assert title.endswith("· scheduler console"), (where, title)


def _confirm(browser: Any, question: str) -> None:
    """Accept the one dialog the click opened, after checking it is our question with the
    id as plain text (an attacker's alert() would come first, with other text)."""
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 5).until(ec.alert_is_present())
    alert = browser.switch_to.alert
    # static/console.js shows bidirectional-text controls as escapes.
    assert alert.text == re.sub("[\u200e\u200f\u202a-\u202e\u2066-\u2069]",
                                lambda m: f"\\u{ord(m.group()):04x}", question)
    alert.accept()


def _done(browser: Any, text: str, where: str) -> None:
    """Wait for the page that says ``text`` in its banner. The page the click was made on
    may have a banner too (the previous action's): waiting for any banner raced the
    navigation, and read the old one as it went stale."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        TimeoutException,
    )
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def shown(b: Any) -> bool:
        try:
            return bool(b.find_element(By.ID, "done").text == text)
        except (NoSuchElementException, StaleElementReferenceException):
            return False

    try:
        WebDriverWait(browser, 10).until(shown)
    except TimeoutException:
        seen = [e.text for e in browser.find_elements(By.ID, "done")]
        raise AssertionError(f"{where}: no banner {text!r}; the page shows {seen}") from None
    _untouched(browser, where)


def test_hostile_ids_run_no_script_when_every_action_is_clicked(console: Console, browser: Any):
    from urllib.parse import quote

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.unit.test_console_hostile import HOSTILE

    store = open_store(console.store_url)
    client = Client(store)
    try:
        soon = datetime.now(UTC) + timedelta(hours=1)
        for h in HOSTILE:
            client.schedule(f"c{h}", soon, "email", {"note": h})
            client.schedule(f"x{h}", soon, "email")
            store.record_dead(client.get(f"x{h}"), f"error {h}", client.clock.now_ms())
            client.recurring.create(f"s{h}", kind="refresh", every="1h")
        first = client.get(f"c{HOSTILE[0]}")
    finally:
        client.close()
        store.close()
    _sign_in(console, browser)
    _csp_violations(browser)  # from here on: none at all

    # Every page that shows the ids, as a signed-in operator sees it (with its forms).
    for name, path in [("fleet", "/fleet"), ("bucket", f"/buckets?at={first.bucket}&shard={first.shard}"),
                       ("job", f"/jobs?id={quote(first.job_id)}"), ("schedules", "/schedules"),
                       ("dead", "/dead"), ("audit", "/audit?run=1")]:
        browser.get(console.url + path)
        _untouched(browser, name)
        assert not _errors(browser), (name, _errors(browser))
        _shot(browser, f"hostile-{name}{console.suffix}")
    browser.get(console.url + "/dead")
    assert f"error {HOSTILE[2]}" in browser.find_element(By.ID, "dead").text  # shown as text

    # Cancel: on each job's page.
    for h in HOSTILE:
        browser.get(console.url + f"/jobs?id={quote('c' + h)}")
        _untouched(browser, f"job c{h}")
        browser.find_element(By.ID, "cancel-button").click()
        _confirm(browser, f"Cancel job c{h}? It will not fire.")
        _done(browser, "Cancelled the job: it will not fire.", f"cancel c{h}")

    # Replay: every hostile dead letter ticked at once.
    browser.get(console.url + "/dead")
    ticks = [t for t in browser.find_elements(By.CSS_SELECTOR, "input[type=checkbox]")
             if (t.get_attribute("value") or "").startswith("x")]
    assert len(ticks) == len(HOSTILE)
    for tick in ticks:
        tick.click()
    browser.find_element(By.ID, "replay-button").click()
    _confirm(browser, "Replay the ticked dead letters? They fire again now.")
    _done(browser, f"Replayed {len(HOSTILE)} dead letters: they fire again now.", "replay")

    # Pause, then resume, each hostile schedule.
    for verb, banner in [("pause", "Paused the schedule."), ("resume", "Resumed the schedule.")]:
        for h in HOSTILE:
            browser.get(console.url + "/schedules")
            form = next(f for f in browser.find_elements(By.CSS_SELECTOR, f"form[action='/schedules/{verb}']")
                        if f.find_element(By.NAME, "schedule_id").get_attribute("value") == f"s{h}")
            form.find_element(By.TAG_NAME, "button").click()
            _confirm(browser, f"{verb.capitalize()} schedule s{h}?")
            _done(browser, banner, f"{verb} s{h}")

    # The audit page: run it, then re-fire its window.
    browser.get(console.url + "/audit")
    button = browser.find_element(By.ID, "audit-button")
    button.click()
    # The click starts a navigation: wait until the page it was made on is gone and the
    # new one is whole (its re-fire form is its last element).
    WebDriverWait(browser, 60).until(ec.staleness_of(button))
    WebDriverWait(browser, 60).until(lambda b: b.execute_script("return document.readyState") == "complete")
    _untouched(browser, "audit run")
    refire = browser.find_elements(By.ID, "refire-button")
    assert refire, ("no re-fire form on the audit page", browser.find_element(By.TAG_NAME, "body").text[:600])
    refire[0].click()
    _confirm(browser, "Send again every job that fired in this window?")
    WebDriverWait(browser, 30).until(ec.presence_of_element_located((By.ID, "done")))
    assert browser.find_element(By.ID, "done").text.startswith("Re-fired ")
    _untouched(browser, "refire")

    # Sign out: the session ends (the next action is refused).
    browser.find_element(By.ID, "logout-button").click()
    _done(browser, "Signed out: that session is over.", "sign out")
    assert not browser.find_elements(By.ID, "logout-button")
    assert _csp_violations(browser) == []

    store = open_store(console.store_url)
    try:
        assert all(store.get(f"c{h}").status is Status.CANCELLED for h in HOSTILE)  # type: ignore[union-attr]
        assert not {d.job_id for d in store.dead_letters()} & {f"x{h}" for h in HOSTILE}
        states = {s.schedule_id: str(s.state) for s in store.list_schedules()}
        assert all(states[f"s{h}"] == "active" for h in HOSTILE)
    finally:
        store.close()
