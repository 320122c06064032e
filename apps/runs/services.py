"""Run verbs that change state, for the transports and other apps (the runs app's face).
Invariants:
- every state change of a run that is not leased is a conditional UPDATE on
  its current status, so a wake-up or cancel happens exactly once;
- a run that holds a lease is changed only by its worker (fenced commit);
  others set flags (cancel) or queue rows (input) and ring the doorbell;
- doorbells, cancel signals and stream notifications go out on commit.

Creating a run is apps.runs.create's and cancelling one apps.runs.cancel's (the floor, which
the wings use too); their verbs are named here as well, the door other apps come in by.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction

from apps.core.errors import Conflict, NotFound, QuotaExhausted, Unprocessable
from apps.core.http import db_call
from apps.core.types import Principal
from apps.gateway import fairness
from apps.runs import signals, statebus, store, tracing
from apps.runs.cancel import ORPHAN_BATCH as ORPHAN_BATCH
from apps.runs.cancel import run_cancel as run_cancel
from apps.runs.cancel import run_orphans_cancel as run_orphans_cancel
from apps.runs.cancel import run_parked_cancels_finish as run_parked_cancels_finish
from apps.runs.cancel import run_stop as run_stop
from apps.runs.create import UNBOUNDED_ITERATIONS as UNBOUNDED_ITERATIONS
from apps.runs.create import Resolved as Resolved
from apps.runs.create import RunCreate as RunCreate
from apps.runs.create import Seed as Seed
from apps.runs.create import routing_of as routing_of
from apps.runs.create import run_create as run_create
from apps.runs.create import run_insert as run_insert
from apps.runs.create import run_resolve as run_resolve
from apps.runs.create import run_routing as run_routing
from apps.runs.create import run_tools as run_tools
from apps.runs.dispatch import broker_emptied, broker_mark, enqueue_iteration
from apps.runs.models import RUNNABLE, TERMINAL, Run, RunStatus, RuntimeState, RuntimeStateValue
from apps.runs.selectors import paused_runs_count, run_get, runs_liveness, runtime_state

log = logging.getLogger("loomcycle.runs")


def runtime_state_get() -> str:
    return runtime_state()


def run_input(*, principal: Principal, run_id: str, text: str) -> dict[str, Any]:
    """Queue steering text; a parked interactive run is woken to consume it."""
    if not text.strip():
        raise Unprocessable("text must not be empty", code="empty_input")
    run = run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    if run.status in TERMINAL:
        raise NotFound(f"run {run_id} is not in flight", code="not_in_flight")
    cap = settings.LOOMCYCLE.steer_queue_cap
    with signals.atomic_if_listened(signals.run_resumed):  # its outbox row commits with the wake
        queued = store.input_queue(run_id=run.id, text=text, cap=cap)
        if queued.woke:
            ring = partial(enqueue_iteration, run.id, queued.step)
            transaction.on_commit(lambda: tracing.woken(run.trace_context, run_id=run.id, reason="input", ring=ring))
            signals.send_on_commit(signals.run_resumed, run_id=run.id)
            statebus.announce_on_commit(
                tenant_id=run.tenant_id, user_id=run.user_id, run_id=run.id, status=RunStatus.RUNNING
            )
    if not queued.accepted:
        raise QuotaExhausted(f"steering queue is full ({cap})", code="steer_queue_full", headers={"Retry-After": "1"})
    return {"run_id": run.id, "delivered": True}


PAUSE_POLL_S = 0.1


async def runtime_pause(*, timeout_ms: int = 30_000) -> dict[str, Any]:
    """Park every run at its next boundary; wait up to `timeout_ms` for in-flight
    iterations. The wait holds no thread: a DB check every PAUSE_POLL_S on the
    event loop. The runtime is `paused` when this returns, even on timeout (the
    stragglers park at their boundary) or when the caller went away, unless a
    resume came first: `state` says which."""
    started = time.monotonic()
    await db_call(_pause_begin)()
    left = await db_call(runtime_pause_settle)(force=False)
    deadline = started + timeout_ms / 1000
    try:
        while left and time.monotonic() < deadline:
            await asyncio.sleep(PAUSE_POLL_S)
            left = await db_call(runtime_pause_settle)(force=False)
    finally:
        if left:  # timed out, or the request was cancelled: paused anyway, as the timeout says
            left = await db_call(runtime_pause_settle)(force=True)
    warnings = [f"{left} run(s) had not parked after {timeout_ms} ms; they park at their next boundary"] if left else []
    return {
        "state": await db_call(runtime_state)(),
        "duration_ms": int((time.monotonic() - started) * 1000),
        "force_cancelled_count": 0,
        "paused_runs_count": await db_call(paused_runs_count)(),
        "warnings": warnings,
    }


def runtime_pause_start() -> dict[str, Any]:
    """Begin a pause without waiting for it (the admin's button: no request thread waits).
    Paused at once when no run is inside an iteration; else `pausing`, which the lease sweep
    settles once the last one has parked (runtime_pause_settle)."""
    _pause_begin()
    left = runtime_pause_settle(force=False)
    return {"state": runtime_state(), "runnable_runs_count": left, "paused_runs_count": paused_runs_count()}


def _pause_begin() -> None:
    with transaction.atomic():
        if store.runtime_state_lock() != RuntimeStateValue.RUNNING:
            raise Conflict("runtime is already paused or pausing", code="already_pausing")
        store.runtime_state_set(RuntimeStateValue.PAUSING)
    # Unleased runnable runs park right away; their queued doorbells become no-ops.
    store.runs_pause_unleased()


def runtime_pause_settle(*, force: bool = False) -> int:
    """`pausing` -> `paused` once no run is runnable (at once with `force`);
    the number of runs still runnable. The lease sweep calls it too, so a pause
    whose web process died still settles."""
    if not RuntimeState.objects.filter(id=1, state=RuntimeStateValue.PAUSING).exists():
        return 0  # not pausing (never was, already settled, or resumed meanwhile)
    left = Run.objects.filter(status__in=RUNNABLE).count()
    if force or not left:
        store.runtime_state_set(RuntimeStateValue.PAUSED, only_from=RuntimeStateValue.PAUSING)
    return left


def runtime_resume() -> dict[str, Any]:
    with transaction.atomic():
        if store.runtime_state_lock() == RuntimeStateValue.RUNNING:
            raise Conflict("runtime is not paused", code="not_paused")
        store.runtime_state_set(RuntimeStateValue.RUNNING)
        resumed = store.runs_resume_paused()
        transaction.on_commit(lambda: _enqueue_all(resumed))
        for run_id, _step in resumed:
            signals.send_on_commit(signals.run_resumed, run_id=run_id)
    return {"state": "running", "resumed_runs_count": len(resumed), "warnings": []}


def run_leases_sweep() -> int:
    """Requeue runnable runs whose lease expired (crashed worker) or that sat
    unleased past the grace period (a doorbell lost before it was sent).
    Each run gets at most one doorbell per grace period. Leases are compared
    with Postgres's clock, as the claim and the heartbeat set them: a sweeper
    host whose clock runs ahead must not take live leases.
    After Redis lost its data (`broker_emptied`), every doorbell queued in it is
    gone: the grace is 0 for that one sweep, so every unleased runnable run is
    rung at once (a run whose doorbell was in fact sent since gets a duplicate,
    a no-op at the claim). The mark is set again only after the requeue committed."""
    emptied = broker_emptied()
    grace = 0.0 if emptied else settings.LOOMCYCLE.requeue_grace_seconds
    with transaction.atomic():
        stale = store.runs_stale_release(grace_seconds=grace)
        if stale:
            transaction.on_commit(lambda: _enqueue_all(stale))
    if emptied:
        log.warning("Redis lost its data (no broker mark): rang %d unleased run(s) at once", len(stale))
        broker_mark()
    if stale:
        log.info("sweeper requeued %d run(s)", len(stale))
    return len(stale)


def run_slots_reconcile() -> int:
    """Beat: refresh the fairness slots of live runs, free those of terminal or
    vanished runs (a process that died before releasing leaks nothing for long)."""
    done = fairness.run_slots_reconcile(liveness=lambda ids: runs_liveness(run_ids=ids))
    if done.freed:
        log.info("fairness: freed %d slot(s) of finished or vanished runs", done.freed)
    return done.freed


def _enqueue_all(doorbells: list[tuple[str, int]]) -> None:
    for run_id, step in doorbells:
        enqueue_iteration(run_id, step)
