"""Retention (issue 38, "Lifecycle"): ended run trees are deleted past the age of their agent,
else their tenant, else LOOMCYCLE_RETENTION_DAYS; no-trace runs are deleted when they end; the
sweep reads through indexes only (EXPLAIN) and holds no lock a live iteration needs."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.core.types import Principal
from apps.gateway.models import UsageEntry
from apps.lifecycle import policies
from apps.lifecycle.retention import retention_sweep
from apps.runs import deletion
from apps.runs.models import Run, RunEvent, RunStatus
from tests.conftest import wait_for, wait_status
from tests.lifecycle.factories import clones, finished_run

ACME = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
BETA = Principal(tenant_id="beta", subject="charlie", scopes=frozenset({"substrate:tenant"}))


@pytest.fixture
def days(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, retention_days=30, retention_batch=7, retention_max_batches=1000
    )


def _alive(ids: list[str]) -> set[str]:
    return set(Run.objects.filter(id__in=ids).values_list("id", flat=True))


@pytest.mark.usefixtures("agents", "days")
def test_each_tree_goes_after_its_agent_then_tenant_then_default_age() -> None:
    now = timezone.now()
    template = finished_run(ACME)
    policies.retention_set(principal=ACME, agent="", max_age_days=10)  # acme: 10 days
    policies.retention_set(principal=ACME, agent="chat", max_age_days=0)  # acme's chat: forever
    acme_old = clones(template, 9, ended_at=now - timedelta(days=11))
    acme_young = clones(template, 3, ended_at=now - timedelta(days=9))
    acme_chat = clones(template, 3, ended_at=now - timedelta(days=400), agent="chat")
    beta_old = clones(template, 8, ended_at=now - timedelta(days=31), tenant_id="beta")
    beta_young = clones(template, 2, ended_at=now - timedelta(days=20), tenant_id="beta")
    spend = sum(UsageEntry.objects.values_list("input_tokens", flat=True))

    result = retention_sweep()

    assert _alive(acme_old + beta_old) == set()
    assert _alive(acme_young + acme_chat + beta_young) == {*acme_young, *acme_chat, *beta_young}
    assert result.trees == 17 and result.kept_live == 0
    assert not RunEvent.objects.filter(run_id__in=acme_old + beta_old).exists()
    assert sum(UsageEntry.objects.values_list("input_tokens", flat=True)) == spend  # the ledger keeps its rows
    assert retention_sweep().trees == 0  # idempotent: a second pass finds nothing due


def _plans(sql: str) -> list[str]:
    plans = []
    with transaction.atomic(), connection.cursor() as cursor:
        for setting in ("on", "off"):
            cursor.execute(f"SET LOCAL enable_seqscan = {setting}")
            cursor.execute(f"EXPLAIN {sql}")
            plans.append(("seqscan " + setting + "\n") + "\n".join(row[0] for row in cursor.fetchall()))
    return plans


def _scans(plan: str) -> bool:
    """A table scan on the hot path. The policies themselves are read whole (a few rows of
    configuration per tenant), by design."""
    if "Seq Scan on lifecycle_retentionpolicy" in plan:
        return False
    return "Seq Scan on runs_run " in plan or ("seqscan off" in plan and "Seq Scan" in plan)


@pytest.mark.usefixtures("agents", "days")
def test_the_sweep_reads_and_deletes_through_indexes_never_a_table_scan() -> None:
    now = timezone.now()
    template = finished_run(ACME)
    policies.retention_set(principal=ACME, agent="echo", max_age_days=5)
    policies.retention_set(principal=BETA, agent="", max_age_days=7)
    kept = clones(template, 3000, ended_at=now - timedelta(days=1))  # the many rows the sweep must not read
    clones(template, 20, ended_at=now - timedelta(days=60))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")

    with CaptureQueriesContext(connection) as queries:
        assert retention_sweep().trees == 20

    verbs = ("SELECT", "DELETE", "UPDATE", "WITH")
    statements = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith(verbs)]
    # Small tables are rightly scanned (a few pages), so every statement is planned twice: as is,
    # where runs_run (3,000+ rows, analyzed) must be read through an index; and with sequential
    # scans disabled, where a Seq Scan left in the plan means no index serves the predicate at all.
    scans = [f"{sql}\n{plan}" for sql in statements for plan in _plans(sql) if _scans(plan)]
    assert not scans, "\n\n".join(scans)
    assert len(_alive(kept)) == 3000


@pytest.mark.usefixtures("agents", "stack")
def test_a_no_trace_run_is_deleted_when_it_ends_unless_an_override_stores_it(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    resp = http.post(
        "/v1/runs",
        json={"agent": "spawner", "prompt": "hi", "background": True, "retention": "no_trace"},
        headers=people["alice"],
    )
    assert resp.status_code == 202, resp.text
    run_id = resp.json()["run_id"]
    wait_for(lambda: not Run.objects.filter(id=run_id).exists())
    assert not Run.objects.filter(parent_id=run_id).exists() and not RunEvent.objects.filter(run_id=run_id).exists()

    until = (timezone.now() + timedelta(hours=1)).isoformat()
    policies.override_set(principal=ACME, agent="spawner", until=until)
    kept = http.post(
        "/v1/runs",
        json={"agent": "spawner", "prompt": "hi", "background": True, "retention": "no_trace"},
        headers=people["alice"],
    ).json()["run_id"]
    wait_status(kept, RunStatus.COMPLETED)
    wait_for(lambda: Run.objects.get(id=kept).retention == "")  # stored: the tenant's age applies from now
    assert RunEvent.objects.filter(run_id=kept).exists()


@pytest.mark.usefixtures("agents", "stack")
def test_a_no_trace_agents_runs_go_when_they_end_unless_the_request_asks_default(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    overlay = {"provider": "mock", "model": "mock-generic", "tools": [], "retention": "no_trace"}
    made = http.post(
        "/v1/_agentdef", json={"op": "create", "name": "ghost", "overlay": overlay}, headers=people["alice"]
    )
    assert made.status_code == 200, made.text
    bad = {**overlay, "retention": "sometimes"}
    refused = http.post(
        "/v1/_agentdef", json={"op": "create", "name": "ghost2", "overlay": bad}, headers=people["alice"]
    )
    assert refused.status_code == 422 and "retention must be one of" in refused.json()["error"]

    def start(**extra: str) -> str:
        body = {"agent": "ghost", "prompt": "hi", "background": True, **extra}
        return str(http.post("/v1/runs", json=body, headers=people["alice"]).json()["run_id"])

    gone, kept = start(), start(retention="default")
    wait_for(lambda: not Run.objects.filter(id=gone).exists())
    assert wait_status(kept, RunStatus.COMPLETED).retention == ""


@pytest.mark.usefixtures("agents", "stack")
def test_a_parked_no_trace_run_shows_its_mark_and_its_cancel_deletes_it(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    body = {"agent": "chat", "prompt": "hi", "background": True, "retention": "no_trace"}
    run = http.post("/v1/runs", json=body, headers=people["alice"]).json()
    wait_status(run["run_id"], RunStatus.AWAITING_INPUT)
    assert http.get(f"/v1/runs/{run['run_id']}", headers=people["alice"]).json()["retention"] == "no_trace"

    assert http.post(f"/v1/agents/{run['agent_id']}/cancel", headers=people["alice"]).status_code == 200

    wait_for(lambda: not Run.objects.filter(id=run["run_id"]).exists())


@pytest.mark.usefixtures("agents", "stack")
def test_a_bad_retention_value_is_a_400_and_leaves_no_run(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    before = Run.objects.count()
    resp = http.post(
        "/v1/runs", json={"agent": "echo", "prompt": "hi", "retention": "forever"}, headers=people["alice"]
    )
    assert resp.status_code == 400 and resp.json()["code"] == "invalid_body"
    assert Run.objects.count() == before


@pytest.mark.usefixtures("agents", "stack", "days")
def test_a_sweep_holding_its_locks_does_not_hold_up_a_live_run(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    """The bound: retention locks only ended trees' rows, so a live iteration waits on none of
    them. Here one tree-delete transaction of a 200-tree backlog stays open (its row locks
    held) while a live run makes all five of its iterations and completes."""
    template = finished_run(ACME)
    backlog = clones(template, 200, ended_at=timezone.now() - timedelta(days=60))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with transaction.atomic():
            for root_id in backlog:
                deletion.tree_delete(root_id=root_id)  # savepoints inside the one open transaction
            held.set()
            release.wait(30)
        connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(60)
        started = time.monotonic()
        run = http.post(
            "/v1/runs", json={"agent": "stepper", "prompt": "hi", "background": True}, headers=people["alice"]
        )
        wait_status(run.json()["run_id"], RunStatus.COMPLETED, timeout=20)
        elapsed = time.monotonic() - started
    finally:
        release.set()
        holder.join()
    assert elapsed < 15  # four 300 ms model calls and five commits; nothing waited for the sweep's locks
    assert _alive(backlog) == set()
