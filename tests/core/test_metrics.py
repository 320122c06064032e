"""GET /metrics and /healthz's replica fields (issue 23, Metrics): a real web process, the
session's Celery workers, mock-script runs with tool calls; the scrape is parsed with
Prometheus's own text parser and its counters are compared with what ran."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from apps.core import metrics as core_metrics
from apps.runs import services
from apps.runs.models import RunStatus
from apps.runs.prompt import Segment
from apps.substrate import services as substrate
from apps.substrate import tokens
from apps.substrate.kinds import get_kind
from apps.triggers.schedules import schedules_tick
from apps.triggers.webhooks.models import Verdict
from apps.triggers.webhooks.services import delivery_record
from loomcycle_project.bootstrap import load_yaml_config
from tests.conftest import ALICE, daphne, wait_for, wait_status
from tests.procs import WorkerPool

REPLICA = "replica-metrics-test"
RUNS = 3
# Each run: one model turn calling Context twice, then one turn of text (2 iterations, 2 provider calls).
SCRIPT = [
    {"tools": [{"tool": "Context", "input": {"op": "self"}}, {"tool": "Context", "input": {"op": "time"}}]},
    {"text": "done"},
]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def metrics_web(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    """One web process for the module, with a replica id of its own."""
    with daphne(stack_env, logdir, name="daphne-metrics", LOOMCYCLE_REPLICA_ID=REPLICA) as base:
        yield base


@pytest.fixture
def admin(agents: None) -> dict[str, str]:
    token = tokens.token_create(name="ops", tenant_id="ops")["token"]
    return {"authorization": f"Bearer {token}"}


def scrape(base: str, headers: dict[str, str]) -> Samples:
    resp = httpx.get(base + "/metrics", headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    out: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over the series whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def test_metrics_count_the_runs_iterations_provider_and_tool_calls_that_ran(
    metrics_web: str, stack: WorkerPool, admin: dict[str, str]
) -> None:
    before = scrape(metrics_web, admin)
    prompt = f"Metrics. MOCK_SCRIPT: {json.dumps(SCRIPT)}"
    runs = [
        services.run_create(principal=ALICE, data=services.RunCreate(agent="scripted", segments=[Segment(text=prompt)]))
        for _ in range(RUNS)
    ]
    for run in runs:
        wait_status(run.id, RunStatus.COMPLETED, timeout=60)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    # The counters are flushed just after each final commit: poll the scrape, not the clock.
    after: Samples = {}

    def flushed() -> bool:
        nonlocal after
        after = scrape(metrics_web, admin)
        return delta("loomcycle_runs_finished_total", status="completed") >= RUNS

    wait_for(flushed, timeout=30, interval=0.2)
    assert delta("loomcycle_runs_finished_total", status="completed") == RUNS
    assert delta("loomcycle_runs_finished_total", status="failed") == 0
    assert delta("loomcycle_iterations_total", outcome="requeue") == RUNS
    assert delta("loomcycle_iterations_total", outcome="finish") == RUNS
    assert delta("loomcycle_iteration_seconds_count") == 2 * RUNS
    assert delta("loomcycle_iteration_seconds_bucket", le="+Inf") == 2 * RUNS
    assert delta("loomcycle_tool_calls_total", tool="Context", result="ok") == 2 * RUNS
    assert delta("loomcycle_tool_calls_total", result="error") == 0
    assert delta("loomcycle_tool_call_seconds_count", tool="Context") == 2 * RUNS
    provider = runs[0].provider
    assert delta("loomcycle_provider_calls_total", provider=provider, result="ok") == 2 * RUNS
    assert delta("loomcycle_provider_calls_total", result="error") == 0
    assert delta("loomcycle_provider_call_seconds_count", provider=provider) == 2 * RUNS
    assert delta("loomcycle_provider_call_seconds_sum", provider=provider) > 0


def test_the_state_gauges_are_read_at_scrape_time(metrics_web: str, stack: WorkerPool, admin: dict[str, str]) -> None:
    subscribe = {"op": "subscribe", "channel": "handoff", "wait_ms": 60_000, "max_messages": 1}
    prompt = f"Park. MOCK_SCRIPT: {json.dumps([{'tool': 'Channel', 'input': subscribe}, {'text': 'x'}])}"
    data = services.RunCreate(agent="scripted", segments=[Segment(text=prompt)])
    run = services.run_create(principal=ALICE, data=data)
    wait_status(run.id, RunStatus.WAITING_CHANNEL, timeout=30)
    samples = scrape(metrics_web, admin)
    assert total(samples, "loomcycle_runs", status="waiting_channel") == 1
    assert total(samples, "loomcycle_runs_parked", kind="waiting_channel") == 1
    assert {dict(ls)["status"] for n, ls in samples if n == "loomcycle_runs"} >= {"queued", "running", "paused"}
    assert {dict(ls)["queue"] for n, ls in samples if n == "loomcycle_queue_depth"} == {"runs", "maintenance"}
    assert total(samples, "loomcycle_db_connections") >= 1
    assert {dict(ls)["source"]: v for (n, ls), v in samples.items() if n == "loomcycle_scrape_error"} == {
        "work_done": 0,
        "runs": 0,
        "database": 0,
        "redis": 0,
        "fairness": 0,
        "budgets": 0,
    }
    services.run_cancel(principal=ALICE, agent_id=run.agent_id)
    wait_status(run.id, RunStatus.CANCELLED, timeout=30)


def test_metrics_need_the_admin_scope(metrics_web: str, admin: dict[str, str]) -> None:
    tenant = tokens.token_create(name="t", tenant_id="acme", subject="alice", scopes=["substrate:tenant"])["token"]
    refused = httpx.get(metrics_web + "/metrics", headers={"authorization": f"Bearer {tenant}"}, timeout=30)
    assert refused.status_code == 403
    assert refused.json()["code"] == "insufficient_scope"
    assert refused.headers["www-authenticate"] == 'Bearer scope="substrate:admin"'
    anonymous = httpx.get(metrics_web + "/metrics", timeout=30)  # an admin token exists: no open mode
    assert anonymous.status_code == 401 and anonymous.json()["code"] == "unauthorized"
    assert httpx.get(metrics_web + "/metrics", headers=admin, timeout=30).status_code == 200


def test_open_mode_serves_metrics_to_loopback_only(db: None, client: Client) -> None:
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    off = client.get("/metrics", REMOTE_ADDR="10.1.2.3")
    assert off.status_code == 403 and off.json()["code"] == "open_mode_loopback"


def test_metrics_disabled_is_a_404_and_healthz_says_so(db: None, client: Client, settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, metrics_enabled=False)
    resp = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert resp.status_code == 404 and resp.json()["code"] == "metrics_disabled"
    assert client.get("/healthz").json()["metrics_enabled"] is False


def test_healthz_names_this_replica_and_lists_the_live_processes(
    metrics_web: str, stack: WorkerPool, admin: dict[str, str]
) -> None:
    def listed() -> httpx.Response | None:  # workers just (re)started write their key once ready
        resp = httpx.get(metrics_web + "/healthz", headers=admin, timeout=30)  # the details are an admin's
        pids = {r["pid"] for r in resp.json()["replicas"] if r["kind"] == "worker"}
        return resp if set(stack.pids()) <= pids else None

    resp = wait_for(listed, timeout=60, interval=0.2)
    assert resp.status_code == 200
    body = resp.json()
    assert body["metrics_enabled"] is True and body["replica_id"] == REPLICA
    replicas = body["replicas"]
    webs = [r for r in replicas if r["kind"] == "web" and r["replica_id"] == REPLICA]
    assert len(webs) == 1 and webs[0]["id"].startswith(REPLICA + ":")
    fields = {"id", "kind", "replica_id", "hostname", "pid", "started_at", "last_heartbeat_at", "version"}
    assert all(set(r) == fields for r in replicas)
    for r in replicas:  # RFC 3339 UTC
        assert r["started_at"].endswith("Z") and r["last_heartbeat_at"].endswith("Z")
        assert datetime.fromisoformat(r["started_at"]) <= datetime.fromisoformat(r["last_heartbeat_at"])
    db_password = django_settings.DATABASES["default"].get("PASSWORD")
    secrets = [str(v) for v in (django_settings.SECRET_KEY, db_password, django_settings.REDIS_URL) if v]
    assert not [v for v in secrets if v in resp.text]


def test_a_histogram_observation_lands_in_its_bucket_and_the_exposition_cumulates() -> None:
    series = core_metrics.Series(values=())
    for seconds in (0.001, 0.3, 0.3, 1000.0):
        series.buckets[core_metrics.bucket_index(seconds)] += 1
    cumulative = dict(series.cumulative())
    assert cumulative["0.005"] == 1 and cumulative["0.25"] == 1 and cumulative["0.5"] == 3
    assert cumulative["300.0"] == 3 and cumulative["+Inf"] == 4


def _count(name: str, *values: str) -> float:
    return sum(s.total for s in core_metrics.read_all().get(name, []) if s.values == values)


def test_schedule_fires_are_counted_by_outcome_once_committed(
    db: None, django_capture_on_commit_callbacks: Any
) -> None:
    load_yaml_config()
    for name, overlay in (("off", {"enabled": False}), ("ghost", {"agent": "no-such-agent"})):
        fields = {"agent": "scripted", "schedule": "* * * * *", "prompt": "x", "user_id": name, **overlay}
        substrate.def_create(
            get_kind("schedule"), substrate.Author(tenant_id="acme", subject="ops"), {"name": name, "overlay": fields}
        )
    t0 = datetime(2026, 11, 24, 12, 0, 30, tzinfo=UTC)
    schedules_tick(now=t0)  # seeds the first slots
    before = {o: _count("loomcycle_schedule_fires", o) for o in ("skipped_disabled", "failed")}
    with django_capture_on_commit_callbacks(execute=False) as pending:
        schedules_tick(now=datetime(2026, 11, 24, 12, 1, 1, tzinfo=UTC))
    assert {o: _count("loomcycle_schedule_fires", o) for o in before} == before  # nothing before the commit
    for callback in pending:
        callback()
    assert {o: _count("loomcycle_schedule_fires", o) - n for o, n in before.items()} == {
        "skipped_disabled": 1,
        "failed": 1,
    }


def test_webhook_delivery_records_are_counted_by_verdict(db: None, django_capture_on_commit_callbacks: Any) -> None:
    before = _count("loomcycle_webhook_deliveries", "rejected_sig")
    with django_capture_on_commit_callbacks(execute=True):
        delivery_record(owner="acme", name="github", delivery_id="d-1", verdict=Verdict.REJECTED_SIG)
    assert _count("loomcycle_webhook_deliveries", "rejected_sig") == before + 1
