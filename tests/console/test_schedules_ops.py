"""The console's Schedules, Webhooks and operator pages (apps/console/views/schedules.py, ops.py)
in a real browser against real web processes and workers: a schedule's next fire times and its
recent fires, a webhook's recent deliveries with their verdicts (operator-only, as over REST),
and the operator pages (runtime pause/resume, snapshots, workers and replicas), which a tenant
token is refused exactly as the REST routes refuse it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser

from apps.snapshots.models import Snapshot
from apps.substrate import tokens
from apps.triggers.models import ScheduleFire
from apps.triggers.schedules import schedules_tick
from tests.conftest import daphne, wait_for
from tests.console.conftest import Console, bearer
from tests.triggers.conftest import WEB_ENV, define, github, payload, post

pytestmark = pytest.mark.usefixtures("web", "agents", "stack")

SCRIPT = "Scheduled. MOCK_SCRIPT: " + json.dumps([{"text": "tick"}])


@pytest.fixture(scope="module")
def hook_web(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    """A web process with the webhook receiver mounted (it serves the console too)."""
    with daphne(stack_env, logdir, "daphne-console-hooks", **WEB_ENV) as base:  # type: ignore[arg-type]
        yield base


def operator_token() -> str:
    return str(tokens.token_create(name="console-ops", tenant_id="ops", scopes=["substrate:admin"])["token"])


def test_a_schedules_next_fire_times_and_recent_fires(
    console: Console, people: dict[str, dict[str, str]], web: str
) -> None:
    with httpx.Client(base_url=web, headers=people["alice"], timeout=30) as api:
        overlay = {"agent": "scripted", "schedule": "*/5 * * * *", "prompt": SCRIPT, "user_id": "cron"}
        made = api.post("/v1/_scheduledef", json={"op": "create", "name": "console-tick", "overlay": overlay})
        def_id = made.json()["def_id"]
        api.post(f"/v1/_schedules/{def_id}/run-now").raise_for_status()
        schedules_tick()  # what beat runs: the run-now slot is due
        fire = wait_for(lambda: ScheduleFire.objects.filter(schedule_def_id=def_id).first(), timeout=20)
        state = api.get(f"/v1/_schedules/{def_id}/state").json()
    page = console.sign_in(bearer(people["alice"]))
    page.click("nav[aria-label=Console] >> text=Schedules")
    assert page.inner_text(f"#schedules tr[data-def='{def_id}'] .next") == state["next_run_at"]
    page.click("#schedules >> text=console-tick")
    page.wait_for_selector("#upcoming")
    times = [
        datetime.fromisoformat(t)
        for t in page.locator("#upcoming time").evaluate_all("els => els.map(e => e.getAttribute('datetime'))")
    ]
    assert times[0] == datetime.fromisoformat(state["next_run_at"].replace("Z", "+00:00"))
    assert len(times) == 5 and all(b - a == timedelta(minutes=5) for a, b in pairwise(times[1:]))
    assert all(t.minute % 5 == 0 for t in times[1:])
    row = page.locator(f"#fires tr[data-run='{fire.run_id}']")
    assert row.locator(".outcome").inner_text().startswith(fire.outcome)
    console.shot(page, "schedule")

    beta = console.sign_in(bearer(people["charlie"]))
    theirs = beta.goto(console.url(f"/ui/schedules/{def_id}/"))
    nowhere = beta.goto(console.url("/ui/schedules/def_00000000000000000000/"))
    assert theirs is not None and nowhere is not None and theirs.status == nowhere.status == 404
    assert beta.locator(f"text={fire.run_id}").count() == 0


def test_a_webhooks_recent_deliveries_show_their_verdicts_to_the_operator_only(
    hook_web: str, browser: Browser, console: Console, people: dict[str, dict[str, str]]
) -> None:
    define("console-hook")
    good = payload(n=1)
    assert post(hook_web, "console-hook", good, github(good)).status_code == 202
    assert post(hook_web, "console-hook", good, {"X-Hub-Signature-256": "sha256=00"}).status_code == 401
    token = operator_token()
    rest = httpx.get(
        f"{hook_web}/v1/_webhooks/console-hook/recent-deliveries", headers={"Authorization": f"Bearer {token}"}
    )
    on_hooks = Console(base=hook_web, browser=browser, screenshots=console.screenshots, contexts=console.contexts)
    page = on_hooks.sign_in(token)
    page.goto(on_hooks.url("/ui/webhooks/"))
    page.click("#webhooks tr[data-name=console-hook] >> text=recent deliveries")
    page.wait_for_selector("#deliveries")
    verdicts = page.locator("#deliveries .verdict").all_inner_texts()
    on_hooks.shot(page, "deliveries")
    assert verdicts == [d["verdict"] for d in rest.json()["deliveries"]] == ["rejected_sig", "accepted"]

    tenant = on_hooks.sign_in(bearer(people["alice"]))
    tenant.goto(on_hooks.url("/ui/webhooks/"))
    assert tenant.locator("#deliveries-operator-only").count() == 1
    refused = tenant.goto(on_hooks.url("/ui/webhooks/console-hook/"))
    assert refused is not None and refused.status == 403 and tenant.inner_text("#error-code") == "insufficient_scope"


@pytest.mark.parametrize(("page_path", "rest"), [("runtime", "/v1/_state"), ("snapshots", "/v1/_snapshots")])
def test_an_operator_page_is_refused_for_a_tenant_token_as_its_rest_route_is(
    console: Console, people: dict[str, dict[str, str]], web: str, page_path: str, rest: str
) -> None:
    page = console.sign_in(bearer(people["alice"]))
    assert page.locator("nav[aria-label=Console] >> text=Operator").count() == 0
    answer = httpx.get(f"{web}{rest}", headers=people["alice"], timeout=30)
    for path in (f"/ui/ops/{page_path}/", "/ui/ops/replicas/"):
        got = page.goto(console.url(path))
        assert got is not None and (got.status, answer.status_code) == (403, 403)
        assert page.inner_text("#error-code") == answer.json()["code"] == "insufficient_scope"
    console.shot(page, f"refused-{page_path}")


def test_the_operator_pauses_and_resumes_the_runtime_captures_a_snapshot_and_sees_the_processes(
    console: Console, web: str
) -> None:
    page = console.sign_in(operator_token())
    page.click("nav[aria-label=Console] >> text=Operator")
    assert page.inner_text("#runtime-state") == "running"
    page.click("#pause")
    page.wait_for_selector("#resume")
    assert page.inner_text("#runtime-state") in ("paused", "pausing")
    console.shot(page, "runtime-paused")
    page.click("#resume")
    page.wait_for_selector("#pause")
    assert page.inner_text("#runtime-state") == "running"

    page.click("text=Snapshots")
    page.fill("#id_label", "from the console")
    page.click("#snapshot-form button[type=submit]")
    page.wait_for_selector("#messages")
    snapshot = Snapshot.objects.get(label="from the console")
    assert page.inner_text(f"#snapshots tr[data-snapshot='{snapshot.id}'] .label") == "from the console"

    page.click("text=Workers and replicas")
    page.wait_for_selector("#worker-processes")
    assert page.locator("#web-processes tr[data-process]").count() >= 1
    assert page.locator("#worker-processes tr[data-process]").count() >= 1
    console.shot(page, "replicas")
