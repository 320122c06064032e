"""The run console in the Django admin (apps/runs/admin.py), through Django's
test client: filters and search, the run page, the actions (each through the
services the API uses), permissions, and the usage page's numbers. The engine
runs in this process (`no_workers`); the browser tests are in
test_admin_browser.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from apps.core.errors import Invalid
from apps.core.types import Principal
from apps.gateway.models import UsageEntry
from apps.gateway.selectors import UsageGroup
from apps.gateway.usage_report import usage_report
from apps.runs import engine, operations, services
from apps.runs.models import TERMINAL, Run, RunEvent, RunStatus, RuntimeState
from apps.runs.prompt import Segment
from tests.conftest import ALICE
from tests.factories.runs import drive

pytestmark = pytest.mark.usefixtures("agents", "no_workers")

CHANGELIST = reverse("admin:runs_run_changelist")
ACME = Principal(tenant_id="acme", subject="acme-ci", scopes=frozenset({"substrate:tenant"}))
BETA = Principal(tenant_id="beta", subject="beta-ci", scopes=frozenset({"substrate:tenant"}))
TOOL_THEN_TEXT = [{"tool": "Context", "input": {"op": "time"}}, {"text": "the time is known"}]


def start(principal: Principal, agent: str = "scripted", script: list[dict[str, Any]] | None = None) -> Run:
    prompt = f"Console test. MOCK_SCRIPT: {json.dumps(script or [{'text': 'hello'}])}"
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)])
    return services.run_create(principal=principal, data=data)


def run_url(view: str, run_id: str) -> str:
    """An admin URL of one run (the admin quotes the `_` of ids in its URLs)."""
    return reverse(f"admin:runs_run_{view}", args=[quote(run_id)])


def change_url(run_id: str) -> str:
    return run_url("change", run_id)


def listed(resp: Any) -> set[str]:
    """The run ids of a changelist page."""
    return {r.id for r in resp.context["cl"].result_list}


def texts(resp: Any) -> list[str]:
    return [str(m) for m in get_messages(resp.wsgi_request)]


@pytest.fixture(autouse=True)
def _end_live_runs(agents: None) -> Iterator[None]:
    """No worker runs these tests' runs: cancel what is still live, so the flush does not
    wait out `agents`' quiesce timeout for queued runs."""
    yield
    for run_id in Run.objects.exclude(status__in=TERMINAL).values_list("id", flat=True):
        services.run_cancel(principal=ALICE, run_id=run_id, reason="test over")


@pytest.fixture
def root(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def staff(username: str, *perms: str) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="runs", codename__in=perms))
    client = Client()
    client.force_login(user)
    return client


def test_the_list_filters_by_tenant_agent_state_and_parent_and_searches_by_id(root: Client) -> None:
    a1, a2, b1 = start(ACME), start(ACME, agent="echo"), start(BETA)
    assert listed(root.get(CHANGELIST, {"tenant": "acme"})) == {a1.id, a2.id}
    assert listed(root.get(CHANGELIST, {"agent": "echo"})) == {a2.id}
    assert listed(root.get(CHANGELIST, {"tenant": "beta", "status__exact": "queued"})) == {b1.id}
    assert listed(root.get(CHANGELIST, {"status__exact": "completed"})) == set()
    assert listed(root.get(CHANGELIST, {"parent": "none"})) == {a1.id, a2.id, b1.id}
    assert listed(root.get(CHANGELIST, {"parent": "any"})) == set()
    assert listed(root.get(CHANGELIST, {"parent": a1.id})) == set()
    assert listed(root.get(CHANGELIST, {"q": b1.agent_id})) == {b1.id}
    assert listed(root.get(CHANGELIST, {"q": a2.id})) == {a2.id}
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    dated = root.get(CHANGELIST, {"created_at__gte": midnight.isoformat(), "tenant": "beta"})
    assert listed(dated) == {b1.id}


def test_the_run_page_shows_the_tool_calls_and_the_ledger_totals(root: Client) -> None:
    run = drive(start(ACME, script=TOOL_THEN_TEXT).id)
    assert run.status == RunStatus.COMPLETED
    ledger = list(UsageEntry.objects.filter(run_id=run.id))
    assert len(ledger) == 2  # one provider call per step
    tokens = sum(e.input_tokens + e.output_tokens for e in ledger)
    page = root.get(change_url(run.id))
    assert page.status_code == 200
    html = page.content.decode()
    assert re.search(r'class="tool-name">Context<', html)
    assert "tool call Context" in html and "&quot;op&quot;: &quot;time&quot;" in html  # its input, indented JSON
    assert "tool result Context" in html and "the time is known" in html
    items = page.context["items"]
    kinds = [i.kind.value for i in items if i.kind.value != "event"]
    assert kinds == ["user", "tool_call", "tool_result", "assistant", "done"]
    assert f"{ledger[0].input_tokens + ledger[1].input_tokens} in" in html
    assert "live tail" not in html  # a finished run has nothing to tail
    row = root.get(CHANGELIST, {"q": run.id})
    (listed_run,) = row.context["cl"].result_list
    assert listed_run.console_usage.tokens == tokens


def test_cancel_goes_through_run_cancel_and_a_second_cancel_says_so(root: Client) -> None:
    run = start(ACME)
    data = {"action": "cancel_selected", "_selected_action": [run.id], "index": "0"}
    first = root.post(CHANGELIST, data, follow=True)
    assert texts(first) == [f"{run.id}: cancel done"]
    done = Run.objects.get(id=run.id)
    assert done.status == RunStatus.CANCELLED and done.stop_reason == "cancelled by admin:root"
    assert RunEvent.objects.filter(run_id=run.id, type="done").count() == 1
    second = root.post(run_url("cancel", run.id), follow=True)
    assert texts(second) == [f"{run.id}: already cancelled"]


def test_retry_reopens_a_failed_run_at_its_last_committed_step(root: Client) -> None:
    run = start(ACME, script=TOOL_THEN_TEXT)
    engine.run_iterate(run_id=run.id, step=0)  # step 0 commits the tool call and its result
    # The next iteration's worker was "lost" max_attempts times: its claim gives up and fails the run.
    Run.objects.filter(id=run.id).update(attempts=settings.LOOMCYCLE.max_attempts)
    failed = drive(run.id)
    assert failed.status == RunStatus.FAILED and failed.step == 2 and "giving up" in failed.error
    transcript_before = failed.transcript_len
    resp = root.post(run_url("retry", run.id), follow=True)
    assert texts(resp) == [f"{run.id}: retry done"]
    reopened = Run.objects.get(id=run.id)
    assert (reopened.status, reopened.step, reopened.error, reopened.attempts) == (RunStatus.RUNNING, 2, "", 0)
    assert reopened.transcript_len == transcript_before  # from the transcript as committed
    (retried,) = RunEvent.objects.filter(run_id=run.id, type="retried")
    assert retried.payload == {"type": "retried", "by": "admin:root", "from_step": 2}
    again = root.post(CHANGELIST, {"action": "retry_selected", "_selected_action": [run.id], "index": "0"}, follow=True)
    refusal = f"run {run.id} is running: only a failed run can be retried (not_failed)"
    assert texts(again) == [f"{run.id}: retry refused: {refusal}"]
    done = drive(run.id)
    assert done.status == RunStatus.COMPLETED
    assert RunEvent.objects.filter(run_id=run.id, type="text").last().payload["text"] == "the time is known"  # type: ignore[union-attr]


def test_fork_from_step_n_starts_a_new_run_in_the_sources_tenant(root: Client) -> None:
    run = start(ACME, script=TOOL_THEN_TEXT)
    done = drive(run.id)
    assert (done.status, done.step) == (RunStatus.COMPLETED, 2)
    page = root.get(run_url("change", run.id)).content.decode()
    assert 'name="from_step" min="0" max="1" value="1"' in page  # the last committed step by default
    resp = root.post(run_url("fork", run.id), {"from_step": "0", "prompt": "once more"}, follow=True)
    fork = Run.objects.get(forked_from_run_id=run.id)
    assert texts(resp) == [f"{run.id}: forked at step 0 as {fork.id}"]
    assert resp.redirect_chain[-1][0] == run_url("change", fork.id)
    assert (fork.tenant_id, fork.agent_name, fork.forked_at_step) == ("acme", "scripted", 0)
    assert fork.session_id != run.session_id
    assert RunEvent.objects.filter(run_id=fork.id, type="forked").exists()
    out_of_range = root.post(run_url("fork", run.id), {"from_step": "7"}, follow=True)
    refusal = f"from_step 7 is out of range: run {run.id} has committed steps 0..1 (step_out_of_range)"
    assert texts(out_of_range) == [f"{run.id}: fork refused: {refusal}"]
    not_a_step = root.post(run_url("fork", run.id), {"from_step": "-1"}, follow=True)
    assert texts(not_a_step)[0].startswith(f"{run.id}: fork refused: from_step:")
    assert Run.objects.filter(forked_from_run_id=run.id).count() == 1


def test_bulk_cancel_reaches_only_the_named_tenant_and_refuses_an_unscoped_request(root: Client) -> None:
    a1, a2, b1 = start(ACME), start(ACME, agent="echo"), start(BETA)
    url = reverse("admin:runs_run_bulk_cancel")
    unscoped = root.post(url, {"tenant_id": "", "agent_name": "", "reason": ""})
    assert unscoped.status_code == 200 and "name a tenant or an agent" in unscoped.content.decode()
    bad = root.post(url, {"tenant_id": "no spaces", "agent_name": ""})
    assert "must match" in bad.content.decode()
    assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.QUEUED}
    resp = root.post(url, {"tenant_id": "acme", "agent_name": "", "reason": "acme is over budget"}, follow=True)
    assert texts(resp) == ["2 run(s) cancelled, 0 had already ended"]
    statuses = dict(Run.objects.values_list("id", "status"))
    assert statuses == {a1.id: RunStatus.CANCELLED, a2.id: RunStatus.CANCELLED, b1.id: RunStatus.QUEUED}
    assert Run.objects.get(id=a1.id).stop_reason == "acme is over budget"
    by_agent = root.post(url, {"tenant_id": "", "agent_name": "scripted"}, follow=True)
    assert texts(by_agent) == ["1 run(s) cancelled, 0 had already ended"]
    assert Run.objects.get(id=b1.id).status == RunStatus.CANCELLED


def test_pause_and_resume_the_runtime_through_the_api_services(root: Client) -> None:
    run = start(ACME)
    url = reverse("admin:runs_run_runtime")
    assert 'value="pause"' in root.get(url).content.decode()
    paused = root.post(url, {"op": "pause"}, follow=True)
    assert texts(paused) == ["runtime paused: 1 run(s) paused"]
    assert RuntimeState.objects.get(id=1).state == "paused" and Run.objects.get(id=run.id).status == RunStatus.PAUSED
    assert 'value="resume"' in paused.content.decode()
    twice = root.post(url, {"op": "pause"}, follow=True)
    assert texts(twice) == ["pause refused: runtime is already paused or pausing (already_pausing)"]
    resumed = root.post(url, {"op": "resume"}, follow=True)
    assert texts(resumed) == ["runtime running: 1 run(s) resumed"]
    assert RuntimeState.objects.get(id=1).state == "running" and Run.objects.get(id=run.id).status == RunStatus.RUNNING
    unknown = root.post(url, {"op": "halt"}, follow=True)
    assert texts(unknown) == ["unknown op 'halt': pause or resume"]


def test_a_staff_user_without_permissions_sees_nothing_and_can_do_nothing() -> None:
    run = start(ACME)
    nobody = staff("nobody")
    assert "Runs" not in nobody.get(reverse("admin:index")).content.decode()
    for url in (
        CHANGELIST,
        change_url(run.id),
        reverse("admin:runs_run_runtime"),
        reverse("admin:runs_run_bulk_cancel"),
        reverse("admin:gateway_usageentry_usage"),
    ):
        assert nobody.get(url).status_code == 403, url
    assert nobody.post(run_url("cancel", run.id)).status_code == 403
    assert nobody.post(reverse("admin:runs_run_runtime"), {"op": "pause"}).status_code == 403
    assert Run.objects.get(id=run.id).status == RunStatus.QUEUED


def test_a_viewer_reads_but_every_action_is_refused() -> None:
    run = start(ACME)
    viewer = staff("viewer", "view_run")
    page = viewer.get(CHANGELIST)
    assert page.status_code == 200 and listed(page) == {run.id}
    assert "cancel_selected" not in page.content.decode()  # no action offered
    assert viewer.get(change_url(run.id)).status_code == 200
    assert "Cancel this run" not in viewer.get(change_url(run.id)).content.decode()
    assert viewer.post(run_url("cancel", run.id)).status_code == 403
    assert viewer.post(run_url("retry", run.id)).status_code == 403
    assert viewer.post(run_url("fork", run.id), {"from_step": "0"}).status_code == 403
    assert viewer.post(reverse("admin:runs_run_runtime"), {"op": "pause"}).status_code == 403
    assert viewer.get(reverse("admin:runs_run_bulk_cancel")).status_code == 403
    assert Run.objects.get(id=run.id).status == RunStatus.QUEUED
    assert viewer.get(change_url("r_doesnotexist"), follow=True).status_code == 200  # back to the list


def ledger(day: date, tenant: str, provider: str, model: str, tokens: tuple[int, int], cost: str | None) -> None:
    UsageEntry.objects.create(
        created_at=datetime(day.year, day.month, day.day, 12, tzinfo=UTC),
        tenant_id=tenant,
        source="run",
        provider=provider,
        model=model,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        cost_usd=Decimal(cost) if cost is not None else None,
    )


def test_the_usage_page_sums_the_ledger_per_day_by_tenant_and_by_model(root: Client) -> None:
    d1, d2 = date(2026, 11, 20), date(2026, 11, 21)
    ledger(d1, "acme", "anthropic", "claude-x", (100, 50), "0.250000")
    ledger(d1, "acme", "openai", "gpt-y", (10, 5), None)
    ledger(d1, "beta", "anthropic", "claude-x", (1000, 500), "1.500000")
    ledger(d2, "acme", "anthropic", "claude-x", (7, 3), "0.010000")
    ledger(date(2026, 11, 10), "acme", "anthropic", "claude-x", (9999, 9999), "9.000000")  # outside the window
    report = usage_report(days=3, today=d2)
    assert report.days == [date(2026, 11, 19), d1, d2]
    by_tenant, by_model = report.sections
    assert by_tenant.by is UsageGroup.TENANT and by_model.by is UsageGroup.MODEL
    cells = {(r.day, r.key): (r.totals.tokens, r.totals.cost_usd, r.totals.unpriced_calls) for r in by_tenant.rows}
    assert cells == {
        (d1, "acme"): (165, Decimal("0.25"), 1),
        (d1, "beta"): (1500, Decimal("1.5"), 0),
        (d2, "acme"): (10, Decimal("0.01"), 0),
    }
    models = {(r.day, r.key): (r.totals.tokens, r.totals.calls) for r in by_model.rows}
    assert models == {
        (d1, "anthropic/claude-x"): (1650, 2),
        (d1, "openai/gpt-y"): (15, 1),
        (d2, "anthropic/claude-x"): (10, 1),
    }
    assert (by_tenant.total.tokens, by_tenant.total.cost_usd, by_tenant.total.calls) == (1675, Decimal("1.76"), 4)
    # the chart: one bar segment per non-empty (day, series), its tooltip naming the value
    assert "2026-11-20 beta: 1500" in by_tenant.tokens_svg and "2026-11-20 acme: 0.25" in by_tenant.cost_svg
    assert by_tenant.tokens_svg.count("<rect") == 3 + 2  # three segments, two legend swatches
    assert "http" not in by_tenant.tokens_svg.replace("http://www.w3.org/2000/svg", "")  # nothing fetched


def test_the_usage_page_renders_and_refuses_a_bad_window(root: Client) -> None:
    ledger(datetime.now(UTC).date(), "acme", "mock", "mock-script", (40, 2), None)
    page = root.get(reverse("admin:gateway_usageentry_usage"), {"days": "7"})
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('class="usage-chart"') == 4
    assert "tokens per day by tenant" in html and "cost (USD) per day by model" in html
    assert "<td>mock/mock-script</td><td>1</td><td>40</td><td>2</td>" in html
    for bad in ("0", "abc", "367", "-1"):
        resp = root.get(reverse("admin:gateway_usageentry_usage"), {"days": bad})
        assert resp.status_code == 400 and b"days must be a whole number from 1 to 366" in resp.content


def test_usage_report_refuses_a_window_out_of_range() -> None:
    with pytest.raises(ValueError):
        usage_report(days=0)


def test_a_tenant_principal_bulk_cancels_only_its_own_tenants_runs() -> None:
    a1, b1 = start(ACME), start(BETA)
    out = operations.runs_cancel_matching(principal=ACME, tenant_id="beta", agent_name="", reason="mine only")
    assert (out.cancelled, out.already_done) == ([a1.id], [])
    assert Run.objects.get(id=b1.id).status == RunStatus.QUEUED
    with pytest.raises(Invalid) as refused:
        operations.runs_cancel_matching(principal=ALICE, tenant_id=None, agent_name="", reason="")
    assert refused.value.code == "bulk_cancel_unscoped"
