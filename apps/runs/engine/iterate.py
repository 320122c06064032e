"""One agent-loop iteration: claim -> model call -> tools -> one fenced commit.

Invariants:
- A delivery does work only if it wins the claim: `step` matches, the run is
  runnable and no live lease exists (compare-and-set, zero rows = someone
  else won or the doorbell is stale), or, carrying the token of the lease its
  step commit armed, adopts that lease (apps.runs.engine.adopt: a Redis SET NX
  and one plain SELECT, no write).
- No transaction or DB connection is held across the provider or tool calls.
- Everything the iteration produced (transcript rows, events with
  consecutive seq, usage, step+1, next status) commits in ONE transaction
  whose UPDATE is fenced on (step, lease_token); a lost fence discards it.
- Doorbells and stream notifications go out only after that commit.
Write commits per iteration: the step commit, and a claim for the first
iteration after any wake-up (an adopted iteration writes nothing before its commit).

A tool may park its call (`ToolResult.park`): the step commits with the run
parked and the wait recorded in the same transaction; whoever answers the
call later resumes the run through `apps.runs.wake.run_answer`.
"""

from __future__ import annotations

import logging
import threading
import time
from enum import StrEnum

import psycopg
from django.conf import settings
from django.db import OperationalError
from redis.exceptions import RedisError

from apps.core import logcontext
from apps.core.database import connection_lost
from apps.core.redact import run_redactor
from apps.core.redis import sync_client
from apps.runs import statebus, store, tracing
from apps.runs.dispatch import notify_events, record_timing, wake_and_enqueue
from apps.runs.engine import metrics
from apps.runs.engine.admission import ADMISSION
from apps.runs.engine.adopt import CLAIM, Claim, adopt
from apps.runs.engine.commit import after_commit, commit_write
from apps.runs.engine.step import execute, open_credentials
from apps.runs.engine.write import Next, StepWrite
from apps.runs.live import LIVE, WORKER_ID
from apps.runs.models import RunStatus
from apps.runs.store import ClaimedRun

log = logging.getLogger("loomcycle.engine")


class Outcome(StrEnum):
    """What one delivery of a doorbell did (`run_iterate`'s result)."""

    NOOP = "noop"  # lost the claim: a stale, future or duplicate doorbell
    FENCE_LOST = "fence_lost"  # the lease moved on during the iteration: its work was discarded
    HANDED_BACK = "handed_back"  # the database went away mid-iteration: the claim was released uncommitted
    REQUEUE = Next.REQUEUE.value
    PARK = Next.PARK.value
    FINISH = Next.FINISH.value


def run_iterate(*, run_id: str, step: int, token: int | None = None) -> Outcome:
    """Execute iteration `step` of `run_id` if this delivery wins the claim, or
    adopts the lease armed with `token` (apps.runs.engine.adopt), after this
    process admits it (apps.runs.engine.admission). Log records made meanwhile
    carry the run's ids (apps.core.logcontext)."""
    with logcontext.bound(run_id=run_id, step=step), ADMISSION.admitted() as waited:
        return _iterate(run_id, step, token, waited)


def _iterate(run_id: str, step: int, token: int | None, waited: float) -> Outcome:
    started = time.perf_counter()
    with LIVE.track(run_id) as cancel:
        run = _claim(run_id, step, token)
        if run is None:
            return Outcome.NOOP
        LIVE.set_token(run_id, run.lease_token, cancel)
        logcontext.update(tenant=run.tenant_id)
        span = tracing.iteration_start(run, WORKER_ID)
        with tracing.active(span):
            if run.first_claim:
                notify_events(run.id, run.last_seq)  # `started` is visible to stream readers now
                statebus.announce(tenant_id=run.tenant_id, user_id=run.user_id, run_id=run.id, status=run.status)
            write = _execute_or_lost(run, cancel)
            committed = commit_write(run, write) if write is not None else None
    if write is None:  # the database connection was lost: nothing of this attempt is kept
        with tracing.active(span, end=True):
            tracing.iteration_done(span, outcome=Outcome.HANDED_BACK.value, status=None, events=0)
        _flush_metrics(StepWrite(status=run.status, next=Next.REQUEUE), Outcome.HANDED_BACK, None, 0.0)
        return _hand_back(run)
    # Outside LIVE.track (the next step may already be claimed in this process), inside the
    # iteration's span: the next doorbell carries it (workers/doorbell.py).
    with tracing.active(span, end=True):
        outcome = _settle(run, write, committed)
        tracing.iteration_done(span, outcome=outcome.value, status=committed, events=len(write.events))
    elapsed = time.perf_counter() - started
    if committed is None:  # the lease fence was lost: the iteration was discarded (Outcome.FENCE_LOST)
        _flush_metrics(write, outcome, None, 0.0)
        return outcome
    record_timing(elapsed, write.provider_s, waited)
    _flush_metrics(write, outcome, committed, elapsed)
    _log_outcome(run, write, committed, elapsed)
    return outcome


def _execute_or_lost(run: ClaimedRun, cancel: threading.Event) -> StepWrite | None:
    """The iteration's write; None when it lost its database connection (a Postgres
    restart or failover, `apps.core.database.connection_lost`) before its commit."""
    try:
        return open_credentials(run) or execute(run, cancel)
    except Exception as exc:
        if not connection_lost(exc):
            raise
        log.warning("run %s step %s lost the database connection mid-iteration (%s)", run.id, run.step, exc)
        return None


# Hand-backs of one step that do not count as attempts. A database that goes away every
# time the step runs (a tool whose query takes the server down) is the step's doing: past
# this many, its hand-backs count, and LOOMCYCLE_MAX_ATTEMPTS ends it as a poison iteration.
HAND_BACKS_FREE = 5
HAND_BACK_KEY_TTL_S = 3600


def _hand_back(run: ClaimedRun) -> Outcome:
    """Release the claim uncommitted and ring the step's doorbell again, without waiting
    for the lease to expire. The attempt is not counted (up to HAND_BACKS_FREE per step):
    a database that went away is not the iteration failing, and LOOMCYCLE_MAX_ATTEMPTS is
    the limit on lost workers. Should the database stay away for a whole lease, this raises,
    and the sweeper takes the run back once its lease has expired, as after a crash."""
    free = _hand_back_free(run.id, run.step)
    if store.claim_hand_back(run_id=run.id, step=run.step, token=run.lease_token, free=free):
        wake_and_enqueue(run.id, None, run.step)
    return Outcome.HANDED_BACK


def _hand_back_free(run_id: str, step: int) -> bool:
    """Whether this hand-back of (run, step) is within HAND_BACKS_FREE (a Redis counter;
    when Redis does not answer either, the attempt counts)."""
    key = f"lc:handback:{run_id}:{step}"
    try:
        pipe = sync_client().pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, HAND_BACK_KEY_TTL_S)
        count = int(pipe.execute()[0])
    except RedisError as exc:
        log.warning("run %s step %s: hand-back not counted in Redis (%s); the attempt counts", run_id, step, exc)
        return False
    return count <= HAND_BACKS_FREE


def _settle(run: ClaimedRun, write: StepWrite, committed: str | None) -> Outcome:
    """After the commit: what the iteration did, and (when it committed) its after-commit work."""
    if committed is None:
        log.warning("run %s step %s: lease fence lost, iteration discarded", run.id, run.step)
        return Outcome.FENCE_LOST
    if committed != write.status:  # input or a cancel arrived during the step: it rang instead of parking
        write.next = Next.REQUEUE
    after_commit(run, write)
    return Outcome(write.next.value)


def _log_outcome(run: ClaimedRun, write: StepWrite, committed: str, elapsed: float) -> None:
    """One DEBUG line per committed iteration; one INFO line (WARNING when failed) per run
    that finished, with its stop reason or its error, redacted as the store redacts it."""
    if write.next != Next.FINISH:
        log.debug("iteration committed: %s, %s (%.1f ms)", committed, write.next.value, elapsed * 1000)
        return
    level = logging.WARNING if committed == RunStatus.FAILED else logging.INFO
    reason = run_redactor(run.credentials).text(write.error) if write.error else write.stop_reason
    log.log(level, "run finished: %s (%s)", committed, reason or "no reason given")


def _flush_metrics(write: StepWrite, outcome: Outcome, committed: str | None, elapsed: float) -> None:
    """The iteration's counters, with the provider and tool calls it made, in one
    Redis round trip (apps.core.metrics); nothing when metrics are off."""
    if not settings.LOOMCYCLE.metrics_enabled:
        return
    batch = write.metrics
    batch.inc(metrics.ITERATIONS, (outcome.value,))
    if committed is not None:
        batch.observe(metrics.ITERATION_SECONDS, (), elapsed)
    if committed is not None and outcome == Outcome.FINISH:
        batch.inc(metrics.RUNS_FINISHED, (committed,))
    batch.flush()


def _claim(run_id: str, step: int, token: int | None) -> ClaimedRun | None:
    lease = settings.LOOMCYCLE.lease_seconds
    try:
        adopted = CLAIM if token is None else adopt(run_id, step, token)
        if not isinstance(adopted, Claim):
            return adopted  # adopted (no write), or None: a duplicate of this doorbell adopted it
        run = store.claim(run_id=run_id, step=step, owner=WORKER_ID, lease_seconds=lease)
    except (psycopg.OperationalError, OperationalError):  # the database stayed away (store._hot retried for a lease)
        wake_and_enqueue(run_id, None, step)  # the claim did not commit: no attempt, and the doorbell rings on
        raise
    if run is not None and run.attempts > 1:  # an earlier claim of this iteration never committed
        log.warning(
            "run %s step %s claimed again (attempt %d): an earlier attempt did not commit", run_id, step, run.attempts
        )
    return run
