"""The run console and Flower in a real browser: headless Debian Chromium
(Playwright) logs into the admin of a running stack (web + workers + beat),
opens a finished mock-script run and sees its tool calls, watches a live
run's page tail new events over the run WebSocket (the admin's session, no
bearer), and opens Flower, started as `make run` starts it, listing the
worker processes. Screenshots are kept under the data dir's artifacts."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.admin.utils import quote as admin_quote
from django.contrib.auth.models import Permission, User
from playwright.sync_api import Browser, Page
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import Run, RunStatus
from apps.runs.prompt import Segment
from loomcycle_project import env as E
from loomcycle_project.management.commands import up
from tests import procs
from tests.conftest import wait_for, wait_status
from tests.factories.browser import launched
from tests.factories.live import REPLY, sent_times

# The web process first: started beside booting workers on a busy host, its first /healthz can miss the 1 s probe.
pytestmark = pytest.mark.usefixtures("web", "agents")

ACME = Principal(tenant_id="acme", subject="acme-ci", scopes=frozenset({"substrate:tenant"}))
PASSWORD = "console-pw-123"


def scripted(steps: list[dict[str, Any]], **kw: Any) -> Run:
    prompt = f"Browser test. MOCK_SCRIPT: {json.dumps(steps)}"
    data = services.RunCreate(agent="scripted", segments=[Segment(text=prompt)], **kw)
    return services.run_create(principal=ACME, data=data)


@pytest.fixture
def artifacts() -> Path:
    path = Path(os.environ["LOOMCYCLE_DATA_DIR"]) / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Browser]:
    with launched(monkeypatch) as chromium:
        yield chromium


@pytest.fixture
def admin_page(browser: Browser, web: str, people: dict[str, dict[str, str]]) -> Page:
    """A page logged into the admin as a superuser (an admin token exists: not open mode)."""
    User.objects.create_superuser("operator", "op@example.com", PASSWORD)
    page = browser.new_page()
    page.goto(f"{web}/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name", timeout=20_000)
    return page


def test_the_admin_shows_a_finished_runs_tool_calls(
    web: str, stack: procs.WorkerPool, admin_page: Page, artifacts: Path
) -> None:
    run = scripted([{"tool": "Context", "input": {"op": "time"}}, {"text": "the time is known"}])
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    page = admin_page
    page.goto(f"{web}/admin/runs/run/?tenant=acme")
    page.wait_for_selector(f"text={run.id}")
    page.click(f"text={run.id}")
    page.wait_for_selector("#timeline")
    tools = page.locator("#tool-calls .tool-name").all_inner_texts()
    titles = page.locator("#timeline .title").all_inner_texts()
    status = page.inner_text("#run-status")
    shot = artifacts / "admin-run.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    assert tools == ["Context"]
    assert status == "completed"
    assert any(t.startswith("tool call Context") for t in titles)
    assert any(t.startswith("tool result Context") for t in titles)
    assert '"op": "time"' in page.inner_text("#timeline li.tool_call pre.detail")
    assert page.locator("#tail-status").count() == 0  # finished: no live tail

    page.fill("#fork input[name=from_step]", "0")  # requeue from step 0: a fork, on its own page
    page.fill("#fork input[name=prompt]", "MOCK_SCRIPT: " + json.dumps([{"text": "forked and answered"}]))
    page.click("#fork input[type=submit]")
    page.wait_for_selector("#forked-from a")
    fork = Run.objects.get(forked_from_run_id=run.id)
    assert page.inner_text("#forked-from") == f"{run.id} at step 0"
    assert f"forked at step 0 as {fork.id}" in page.inner_text(".messagelist")
    wait_status(fork.id, RunStatus.COMPLETED, timeout=30)
    page.reload()
    assert page.inner_text("#run-status") == "completed"
    shot = artifacts / "admin-fork.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")


def test_a_live_runs_page_tails_new_events_over_the_websocket(
    web: str, stack: procs.WorkerPool, admin_page: Page, artifacts: Path
) -> None:
    run = scripted([{"text": "first turn"}, {"text": "second turn, live"}], interactive=True)
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30)
    page = admin_page
    # The admin's own quoting: a raw id such as r_25… would unquote `_25` to `%` (a 302 to the list).
    page.goto(f"{web}/admin/runs/run/{admin_quote(run.id)}/change/")
    page.wait_for_selector("#tail-status:has-text('connected')", timeout=20_000)
    before = page.locator("#timeline li").count()
    services.run_input(principal=ACME, run_id=run.id, text="go on")
    page.wait_for_selector("#timeline li:has-text('second turn, live')", timeout=30_000)
    shot = artifacts / "admin-live-tail.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    assert page.locator("#timeline li").count() > before
    assert page.locator("#timeline li.user:has-text('go on')").count() == 1  # the steer, as it arrived
    services.run_cancel(principal=ACME, run_id=run.id, reason="test over")
    page.wait_for_selector("#tail-status:has-text('ended')", timeout=20_000)


def test_the_live_tail_shows_a_turns_text_while_the_model_still_writes_it(
    web: str, stack: procs.WorkerPool, admin_page: Page, artifacts: Path
) -> None:
    """Issue 36: the run console's live tail grows the model's text from its live frames, before
    the mock has sent the last piece of it (arrival against the mock's own send times)."""
    live_turn = {"text": REPLY, "chunk_chars": 4, "chunk_ms": 60}
    run = scripted([{"text": "first turn"}, live_turn], interactive=True)
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30)
    page = admin_page
    page.goto(f"{web}/admin/runs/run/{admin_quote(run.id)}/change/")
    page.wait_for_selector("#tail-status:has-text('connected')", timeout=20_000)
    services.run_input(principal=ACME, run_id=run.id, text="go on")
    item = page.locator("#timeline li.assistant", has=page.locator(".meta", has_text="live")).filter(has_text="word05")
    item.last.wait_for(timeout=30_000)
    seen_at, meta = time.time(), item.last.locator(".meta").inner_text()
    shot = artifacts / "admin-live-text.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=60)
    assert seen_at < sent_times(run.id)[-1], "the console showed the text only after the mock had sent it all"
    assert meta == "live"  # a live item: no committed seq yet
    page.wait_for_function(
        "t => [...document.querySelectorAll('#timeline li.assistant pre')].some(p => p.textContent === t)",
        arg=REPLY,
        timeout=30_000,
    )  # the committed frame brought the rest: the item holds the whole turn
    services.run_cancel(principal=ACME, run_id=run.id, reason="test over")


def test_the_runtime_is_paused_and_resumed_from_the_admin_under_daphne(
    web: str, stack: procs.WorkerPool, admin_page: Page
) -> None:
    """The pause service is async (it waits for in-flight iterations): the admin's sync view
    runs it on the web process's event loop."""
    page = admin_page
    page.goto(f"{web}/admin/runs/run/runtime/")
    page.click("button[value=pause]")
    page.wait_for_selector("#runtime-state:has-text('paused')", timeout=20_000)
    assert "run(s) paused" in page.inner_text("ul.messagelist")
    page.click("button[value=resume]")
    page.wait_for_selector("#runtime-state:has-text('running')", timeout=20_000)
    assert "run(s) resumed" in page.inner_text("ul.messagelist")


def test_flower_started_as_make_run_does_lists_the_worker_processes(
    stack: procs.WorkerPool,
    stack_env: dict[str, str],
    logdir: Path,
    browser: Browser,
    artifacts: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = procs.free_port()
    monkeypatch.setattr(E, "FLOWER_PORT", port)
    monkeypatch.setattr(E, "FLOWER_ADDRESS", "127.0.0.1")
    child = up.flower_child(up.celery_argv())  # the child `manage.py up` starts, as it starts it
    proc = procs.spawn(child.argv, {**stack_env, **child.extra_env}, logdir / "flower.log")
    base = f"http://127.0.0.1:{port}"
    try:
        procs.wait_http(base + "/healthcheck", timeout=60)
        # Flower lists what the workers' heartbeat events (every 2 s) have told it so far.
        seen = wait_for(lambda: _live_workers(base) if len(_live_workers(base)) >= len(stack.pids()) else None, 30)
        page = browser.new_page()
        page.goto(base + "/workers")
        page.wait_for_selector("#workers-table tbody tr")
        rows = page.locator("#workers-table tbody tr").all_inner_texts()
        shot = artifacts / "flower-workers.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")
    finally:
        procs.stop(proc)
    assert all(name.startswith("test") for name in seen)
    assert {name for name in seen if any(name in row for row in rows)} == set(seen)


def _live_workers(base: str) -> list[str]:
    """The workers Flower's own page data (`?json=1`) lists as online."""
    listed = httpx.get(base + "/workers", params={"json": 1}, timeout=10).json()["data"]
    return sorted(str(info["hostname"]) for info in listed if info.get("status"))


def _tail(web: str, run_id: str, headers: dict[str, str]) -> tuple[list[str], int]:
    """The events a run WebSocket sends with these handshake headers, and its close code."""
    url = web.replace("http://", "ws://") + f"/ws/runs/{run_id}/"
    events: list[str] = []
    with connect(url, additional_headers=headers) as ws, pytest.raises(ConnectionClosed) as info:
        while True:
            events.append(json.loads(ws.recv(timeout=10))["event"])
    assert info.value.rcvd is not None
    return events, info.value.rcvd.code


def _session_cookie(web: str, username: str) -> str:
    """The session cookie of a login through the web process's admin login form."""
    with httpx.Client(base_url=web, timeout=30) as client:
        client.get("/admin/login/")
        form = {"username": username, "password": PASSWORD, "csrfmiddlewaretoken": client.cookies["csrftoken"]}
        login = client.post("/admin/login/?next=/admin/", data=form, headers={"Referer": web + "/admin/login/"})
        assert login.status_code == 302, login.text[-500:]  # a refused login renders the form again (200)
        return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME]}"


def test_an_admin_session_opens_the_run_websocket_only_same_origin_and_with_view_permission(
    web: str, stack: procs.WorkerPool, people: dict[str, dict[str, str]]
) -> None:
    run = scripted([{"text": "tailed"}])
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    viewer = User.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(content_type__app_label="runs", codename="view_run"))
    User.objects.create_user("bystander", password=PASSWORD, is_staff=True)
    same = {"Origin": web}  # the client sends Host: the web's host:port
    events, code = _tail(web, run.id, {**same, "Cookie": _session_cookie(web, "viewer")})
    assert code == 1000 and "text" in events and events[-1] == "done"
    for headers in (
        {"Origin": "http://evil.example", "Cookie": _session_cookie(web, "viewer")},  # another site's page
        {**same, "Cookie": _session_cookie(web, "bystander")},  # staff without runs.view_run
        {**same, "Cookie": f"{settings.SESSION_COOKIE_NAME}=not-a-session"},
        same,  # no session, no bearer, out of open mode
    ):
        assert _tail(web, run.id, headers) == ([], 4401), headers
