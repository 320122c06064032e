"""The two queues a new top-level run can wait in, and the promotions out of them:
admission backpressure (`waiting_slot`) and its session's turn (`waiting_session`).

Admission is loomcycle's `concurrency` block (`max_concurrent_runs`,
`max_queue_depth`, `queue_timeout_ms`), cluster-wide in Postgres.

A top-level run holds a slot from its admission until it ends (parked runs
keep theirs, as in loomcycle; sub-agents share their parent's: this queue
admits trees, FIFO, and a child never waits in it, since a parent parked on
children that wait for slots held by parents would deadlock. Descendants are
bounded by the per-tenant and per-user caps instead, which count them:
apps.gateway.fairness). Over the cap,
a new run is inserted as a `waiting_slot` row: it has no doorbell, so no
worker holds it, and the claim ignores it. When a slot frees (a top-level run
finishes or is cancelled) the oldest waiting rows are flipped to `queued` and
their doorbells rung after the commit (`apps.runs.wake.runs_admit_waiting`);
beat runs the same promotion as a backstop. A full queue is 429
`backpressure` before any row is written.

A session (apps.runs.sessions) lets one run at a time be in flight: `session_place`
decides, inside run_create's transaction and under the session's advisory lock, where a
new run goes (its turn, and whether it waits behind the live one, by its request's
`multitask_strategy`), and `session_promote` moves the session's oldest enqueued run on
(to `queued`, or to `waiting_slot` when admission is on, so a promoted run still waits
for its admission slot). Both queues live here, in the floor, because run creation, a
withdrawn waiting run and the end of a run (apps.runs.lifecycle) all move them.

Invariants:
- every decision (count, promote, admit or queue) runs under ONE transaction
  advisory lock, so two web processes or workers never both take the last
  slot, and the counts are Postgres's committed rows, never a counter that
  could drift;
- first in, first out: a new run is admitted directly only when nobody waits;
- a waiting row leaves the queue exactly once: promoted (`SKIP LOCKED`, so a
  row being withdrawn is never promoted) or withdrawn/cancelled under its
  row lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from enum import StrEnum

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, connection, transaction

from apps.core.errors import Conflict, NotFound, QuotaExhausted, Unprocessable
from apps.core.pubsub import hub
from apps.gateway import fairness
from apps.gateway.fairness.config import concurrency_knob
from apps.runs import store
from apps.runs.dispatch import run_channel, wake_and_enqueue
from apps.runs.selectors import run_status, session_runs
from apps.runs.statuses import TERMINAL, RunStatus

log = logging.getLogger("loomcycle.runs")

RETRY_AFTER = {"Retry-After": "5"}
REPOLL_S = 1.0  # a waiting request re-reads its run at least this often (a lost ring costs latency only)


@dataclass(frozen=True)
class Limits:
    max_concurrent_runs: int  # 0 = off
    max_queue_depth: int
    queue_timeout_ms: int


def limits() -> Limits:
    """yaml `concurrency:` when it sets a knob, else LOOMCYCLE_MAX_CONCURRENT_RUNS,
    LOOMCYCLE_MAX_QUEUE_DEPTH, LOOMCYCLE_QUEUE_TIMEOUT_MS."""
    return Limits(
        max_concurrent_runs=concurrency_knob("max_concurrent_runs", settings.LOOMCYCLE.max_concurrent_runs),
        max_queue_depth=concurrency_knob("max_queue_depth", settings.LOOMCYCLE.max_queue_depth),
        queue_timeout_ms=concurrency_knob("queue_timeout_ms", settings.LOOMCYCLE.queue_timeout_ms),
    )


class Backpressure(QuotaExhausted):
    """429 `{"code": "backpressure", "error": "queue full" | "queue timeout"}` (loomcycle's body) + Retry-After."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="backpressure", headers=RETRY_AFTER)


@dataclass(frozen=True)
class Promoted:
    run_id: str
    step: int
    last_seq: int


def _lock_and_promote(cap: int) -> tuple[int, int, list[Promoted]]:
    """Inside a transaction: take the admission lock, move waiting runs into
    free slots (all of them when `cap` is 0). Returns (admitted, waiting, promoted)."""
    admitted, waiting = store.admission_lock_and_count()  # the lock is held to commit
    free = waiting if cap <= 0 else min(max(cap - admitted, 0), waiting)
    promoted = [Promoted(r, s, q) for r, s, q in store.waiting_promote(free)] if free else []
    return admitted + len(promoted), waiting - len(promoted), promoted


def admission_status(limit: Limits) -> tuple[str, list[Promoted]]:
    """In run_create's transaction, before the insert: `queued` (admitted) or
    `waiting_slot`, and the waiting runs promoted on the way (their doorbells
    go out on commit); Backpressure when the queue is full (a raise rolls the
    promotions back too: the next finish or beat's sweep makes them)."""
    admitted, waiting, promoted = _lock_and_promote(limit.max_concurrent_runs)
    if admitted < limit.max_concurrent_runs and waiting == 0:
        return RunStatus.QUEUED, promoted
    if waiting >= limit.max_queue_depth:
        raise Backpressure("queue full")
    return RunStatus.WAITING_SLOT, promoted


def promote_waiting() -> list[Promoted]:
    """Fill free slots from the queue, in its own transaction; the caller rings
    the doorbells of what it returns after this commit."""
    with transaction.atomic():
        return _lock_and_promote(limits().max_concurrent_runs)[2]


def withdraw_waiting(run_id: str) -> bool:
    """Remove a run that is still waiting for its slot (a streaming request
    that waited past `queue_timeout_ms`, or whose client left): True when it
    was removed, False when it was admitted meanwhile (and must run). The run was
    its session's live one: a run enqueued behind it there is promoted after the
    commit (as a run's end does, apps.runs.sessions.promotion)."""
    with transaction.atomic():
        session_id = store.waiting_withdraw(run_id)
        if session_id is None:
            return False
        transaction.on_commit(lambda: fairness.run_slot_release(run_id))
        transaction.on_commit(lambda: session_promote_after_commit(session_id))
    return True


def _waiting(run_id: str) -> bool:
    try:
        return run_status(run_id=run_id) == RunStatus.WAITING_SLOT
    finally:
        connection.close()


def _withdraw(run_id: str) -> bool:
    try:
        return withdraw_waiting(run_id)
    finally:
        connection.close()


_withdrawals: set[asyncio.Task[bool]] = set()  # strong references until they finish


async def slot_awaited(run_id: str, timeout_ms: int) -> None:
    """A streaming POST /v1/runs whose run waits for a slot: return once it is
    admitted. loomcycle holds such a request before its SSE stream opens and
    answers 429 when the wait times out, leaving no run; so past `timeout_ms`
    the waiting row is withdrawn and Backpressure("queue timeout") raised, and
    a client that hangs up meanwhile withdraws it too. Waits on the run's
    doorbell channel (the promotion rings it), no thread is held."""
    bells = hub()
    wake = await bells.subscribe(run_channel(run_id))
    waiting = sync_to_async(_waiting, thread_sensitive=False)
    deadline = time.monotonic() + timeout_ms / 1000
    try:
        while (left := deadline - time.monotonic()) > 0:
            if not await waiting(run_id):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.get(), timeout=min(left, REPOLL_S))
    except asyncio.CancelledError:  # the client left before its stream opened
        task = asyncio.get_running_loop().create_task(sync_to_async(_withdraw, thread_sensitive=False)(run_id))
        _withdrawals.add(task)
        task.add_done_callback(_withdrawals.discard)
        raise
    finally:
        await bells.unsubscribe(run_channel(run_id), wake)
    if await sync_to_async(_withdraw, thread_sensitive=False)(run_id):
        raise Backpressure("queue timeout")


# --- A session's queue (SPEC 2.3, 4.5; the strategies are described in apps.runs.sessions.promotion).


class Strategy(StrEnum):
    """What a request does when its session has a run in flight."""

    REJECT = "reject"
    ENQUEUE = "enqueue"
    INTERRUPT = "interrupt"
    ROLLBACK = "rollback"


def strategy_of(value: str | None) -> Strategy:
    """The request's strategy (`reject` when omitted); 422 `invalid_multitask_strategy` otherwise."""
    if value is None:
        return Strategy.REJECT
    try:
        return Strategy(value)
    except ValueError:
        known = ", ".join(s.value for s in Strategy)
        raise Unprocessable(
            f"unknown multitask_strategy {value!r}: one of {known}", code="invalid_multitask_strategy"
        ) from None


@dataclass(frozen=True)
class Place:
    """Where a new run goes in its session (decided under the session's lock)."""

    session_id: str
    turn: int
    waits: bool  # inserted `waiting_session`: a run of the session is live
    cancel: tuple[str, ...] = ()  # live runs flagged for cancel with the new run, finished after (interrupt, rollback)
    reason: str = ""


def session_place(*, tenant_id: str, user_id: str, session_id: str, strategy: Strategy) -> Place:
    """Inside run_create's transaction: lock the session, check it is this owner's
    (NotFound otherwise, as for an unknown id), and apply `strategy` if a run of it is
    live (409 `session_busy` for `reject`). A rollback's marks, and the cancel flags of
    the runs interrupt/rollback displace, commit with the new run."""
    store.session_lock(session_id)
    runs = session_runs(tenant_id=tenant_id, user_id=user_id, session_id=session_id)
    if not runs:
        raise NotFound(f"unknown session {session_id}", code="session_not_found")
    turn = runs[-1].turn + 1
    live = [r for r in runs if r.status not in TERMINAL]
    if not live:
        return Place(session_id, turn, waits=False)
    if strategy == Strategy.REJECT:
        busy = next((r.id for r in live if r.status != RunStatus.WAITING_SESSION), live[0].id)
        raise Conflict(f"session {session_id} has a run in flight", code="session_busy", details={"run_id": busy})
    if strategy == Strategy.ENQUEUE:
        return Place(session_id, turn, waits=True)
    ids = [r.id for r in reversed(live)]  # the enqueued ones first: none of them is promoted on the way
    if strategy == Strategy.ROLLBACK:
        store.session_rollback_mark(run_ids=ids)
    reason = f"multitask_strategy={strategy.value}"
    store.session_cancel_mark(run_ids=ids, reason=reason)
    return Place(session_id, turn, waits=True, cancel=tuple(ids), reason=reason)


def session_promote(session_id: str) -> bool:
    """Move the session's oldest enqueued run on if none of its runs is live: to
    `queued` (doorbell after the commit), or to `waiting_slot` when admission is on
    (the admission promotion that follows a run's end starts it)."""
    gated = limits().max_concurrent_runs > 0
    status = RunStatus.WAITING_SLOT if gated else RunStatus.QUEUED
    with transaction.atomic():
        store.session_lock(session_id)
        moved = store.session_promote(session_id=session_id, status=status)
    if moved is None:
        return False
    if not gated:  # gated: the admission promotion after a run's end (or beat's) admits it
        wake_and_enqueue(moved[0], moved[2], moved[1])
    return True


def session_promote_after_commit(session_id: str) -> None:
    """After a run enqueued in the session committed: promote, in case the live run
    it queued behind ended before that commit (its `session_next` found no waiting
    row then). A database error is logged: the lease sweep promotes it."""
    try:
        session_promote(session_id)
    except DatabaseError:
        log.exception("session %s: promoting after an enqueue failed, the lease sweep will", session_id)
