"""Writes outside the engine's iteration (part of apps/runs/store/, the one
package that writes the runs app's tables): run creation, the lease
heartbeat, answers to parked calls, cancel, steering input, pause/resume,
the stale-lease sweep and the child report. Events and transcript rows are
appended by the append primitive (store.append), in the statement that
updates or inserts the run row.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q
from django.db.models.functions import Now
from django.utils import timezone

from apps.core.redact import Redactor
from apps.runs.credentials import run_redactor_of
from apps.runs.models import Run, RunInput, RuntimeState
from apps.runs.statuses import ANSWERABLE, PARKED, RUNNABLE, TERMINAL, RunStatus, ToolCallStatus
from apps.runs.store.append import _advance, _append, _bases, _in, _json, _rows

log = logging.getLogger("loomcycle.runs")


@functools.cache
def _insert_run_sql() -> tuple[str, list[Any]]:
    """One statement: the run row (every column of the model, in its order),
    its first transcript row and its first events (the append primitive, on
    the inserted row). Built once per process."""
    fields = list(Run._meta.concrete_fields)
    columns = ", ".join(connection.ops.quote_name(str(f.column)) for f in fields)
    values = ", ".join(f"%(f{i})s" for i in range(len(fields)))
    sql = f"""
WITH d AS (SELECT %(rows)s::jsonb AS j), ins AS (
  INSERT INTO runs_run ({columns}) VALUES ({values}) RETURNING id, {_bases("%(n_e)s", "%(n_t)s")}
), {_append(run="ins", sources="ins, d", rows="d.j", step="0", at="%(at)s")}
SELECT count(*) FROM ins
"""
    return sql, fields


def insert_run(
    run: Run,
    *,
    first_message: list[dict[str, Any]] | None,
    events: list[dict[str, Any]],
    redactor: Redactor,
    history: list[tuple[str, list[dict[str, Any]]]] | None = None,
) -> None:
    """Insert an unsaved `Run` with its first user message (transcript idx 0)
    and its first events (seq 1..n), in one statement; `run` becomes a saved
    instance with its counters set. The ORM's three INSERTs cost ~1.7 ms of
    CPU, mostly compiling them. Through Django's cursor, so a duplicate
    `agent_id` raises Django's IntegrityError. The run's caller-supplied text
    (system blocks, metadata) is redacted with its rows. A fork (apps.runs.fork)
    passes the copied `history`, which comes first; its `first_message` may be None."""
    sql, fields = _insert_run_sql()
    now = timezone.now()
    transcript = list(history or []) + ([("user", first_message)] if first_message is not None else [])
    run.system, run.metadata = redactor.value(run.system), redactor.value(run.metadata)
    run.created_at = run.updated_at = now
    run.last_seq, run.transcript_len = len(events), len(transcript)  # the row's counters start past its first rows
    params = {f"f{i}": f.get_db_prep_save(getattr(run, f.attname), connection) for i, f in enumerate(fields)}
    params.update(_rows(events, transcript, redactor=redactor), at=now)
    with connection.cursor() as cur:
        cur.execute(sql, params)
    run._state.adding = False
    run._state.db = connection.alias


# --- Writes outside the iteration: heartbeat, answers, cancel, input, pause, sweeps.

# An adopted lease (armed by a step commit, unowned: apps.runs.store.adopt) is extended by
# its token and named this worker's by its first beat; a released one (no lease_until) is not.
_HEARTBEAT_SQL = """
UPDATE runs_run r SET lease_until = now() + make_interval(secs => %(lease)s), last_heartbeat_at = now(),
  lease_owner = %(owner)s
FROM unnest(%(ids)s::text[], %(toks)s::bigint[]) AS l(id, tok)
WHERE r.id = l.id AND r.lease_token = l.tok
  AND (r.lease_owner = %(owner)s OR (r.lease_owner = '' AND r.lease_until IS NOT NULL))
"""


def leases_extend(*, owner: str, lease_seconds: float, leased: list[tuple[str, int]]) -> None:
    """One UPDATE for every run in flight in this process. Fenced: only leases
    `owner` still holds, or adopted, with these tokens are extended."""
    ids, toks = [r for r, _ in leased], [t for _, t in leased]
    params: dict[str, Any] = {"lease": lease_seconds, "owner": owner, "ids": ids, "toks": toks}
    with connection.cursor() as cur:
        cur.execute(_HEARTBEAT_SQL, params)


# The run row locked first (answers to one run are serialised), with the call's
# started record in the same round trip.
_ANSWER_LOCK_SQL = """
SELECT r.status, r.step, rec.id, rec.step, rec.input, r.credentials_sealed, r.trace_context, r.pending_calls,
  r.tenant_id, r.user_id
FROM runs_run r
LEFT JOIN LATERAL (
  SELECT id, step, input FROM runs_toolcallrecord WHERE run_id = r.id AND call_id = %s ORDER BY step DESC LIMIT 1
) rec ON true
WHERE r.id = %s
FOR UPDATE OF r
"""

# Everything the answer writes, in one statement; returns whether this answer
# woke the run (exactly the answer that brings pending_calls to 0) and last_seq.
_ANSWER_SQL = f"""
WITH d AS (SELECT %(rows)s::jsonb AS j), ans AS (
  UPDATE runs_run SET
    {_advance("%(n_e)s", "%(n_t)s")}, pending_calls = pending_calls - 1,
    status = CASE WHEN status IN ({_in(ANSWERABLE)}) AND pending_calls = 1
      THEN '{RunStatus.RUNNING.value}' ELSE status END,
    updated_at = now()
  WHERE id = %(run_id)s
  RETURNING id, last_seq, status = '{RunStatus.RUNNING.value}' AND pending_calls = 0 AS woke,
    {_bases("%(n_e)s", "%(n_t)s")}
), {_append(run="ans", sources="ans, d", rows="d.j", step="%(step)s")}, c AS (
  UPDATE runs_toolcallrecord SET status = '{ToolCallStatus.FINISHED.value}', is_error = %(is_error)s,
    finished_at = now()
  WHERE id = %(record_id)s
)
SELECT woke, last_seq FROM ans
"""


@dataclass(frozen=True)
class AnswerTarget:
    """A live run, locked, and the started record of the call being answered."""

    run_step: int
    step: int  # the step the answer's rows belong to: the call's, else the last committed one
    call_input: dict[str, Any]
    record_id: int | None
    redactor: Redactor  # the run's (its credentials included): what the answer appends is redacted
    trace_context: str = ""  # the run's root span (apps.runs.tracing): a wake is traced in the run's trace
    owner: tuple[str, str] = ("", "")  # (tenant_id, user_id): a wake is announced to the user's streams


def answer_lock(*, run_id: str, call_id: str) -> AnswerTarget | None:
    """Inside the answerer's transaction: lock the run row (answers to one run
    are serialised); None when the run is gone or terminal, or waits for no
    call (an answer nobody parked for is dropped: it must never drive
    `pending_calls` below zero)."""
    with connection.cursor() as cur:
        cur.execute(_ANSWER_LOCK_SQL, [call_id, run_id])
        row = cur.fetchone()
    if row is None or row[0] in TERMINAL:
        return None
    _, run_step, record_id, record_step, record_input, sealed, trace_context, pending_calls, *owner = row
    if pending_calls <= 0:
        log.warning("answer to call %r of run %s dropped: the run waits for no call", call_id, run_id)
        return None
    redactor = run_redactor_of(run_id=run_id, sealed=sealed)
    who = (owner[0], owner[1])
    if record_id is None:
        return AnswerTarget(run_step, max(run_step - 1, 0), {}, None, redactor, trace_context, who)
    return AnswerTarget(run_step, record_step, _json(record_input), record_id, redactor, trace_context, who)


def answer_append(
    *, run_id: str, target: AnswerTarget, events: list[dict[str, Any]], block: dict[str, Any], is_error: bool
) -> tuple[bool, int]:
    """Append an answer under `answer_lock`'s lock: its events, its transcript
    row (`block`, a user turn), the finished record, one pending call fewer.
    Returns (woke: this answer flipped the run back to running, last_seq)."""
    params = _rows(events, [("user", [block])], redactor=target.redactor)
    params.update(run_id=run_id, step=target.step, is_error=is_error, record_id=target.record_id)
    with connection.cursor() as cur:
        cur.execute(_ANSWER_SQL, params)
        woke, last_seq = cur.fetchone()
    return bool(woke), int(last_seq)


_CANCEL_FLAG_SQL = f"""
UPDATE runs_run SET cancel_requested = true, cancel_reason = %s WHERE id = %s AND status NOT IN ({_in(TERMINAL)})
"""

# Conditional: only a run no live worker holds is finished here (an armed lease no worker
# has named itself the owner of holds none: apps.runs.store.adopt); bumping lease_token
# voids any fence a slow, lease-expired worker, or an adopter yet to beat, still has.
_CANCEL_FINISH_SQL = f"""
WITH d AS (SELECT %(rows)s::jsonb AS j), cnl AS (
  UPDATE runs_run SET status = '{RunStatus.CANCELLED.value}', stop_reason = %(reason)s,
    completed_at = now(), updated_at = now(), lease_owner = '', lease_until = NULL, credentials_sealed = '',
    lease_token = lease_token + 1, step = step + 1, {_advance("%(n_e)s")}
  WHERE id = %(run_id)s AND status IN ({_in((*RUNNABLE, *PARKED))})
    AND (lease_until IS NULL OR lease_until < now() OR lease_owner = '')
  RETURNING id, last_seq, step - 1 AS cancelled_step, {_bases("%(n_e)s")}
), {_append(run="cnl", sources="cnl, d", rows="d.j", step="cnl.cancelled_step", transcript=False)}
SELECT last_seq FROM cnl
"""


def cancel(*, run_id: str, reason: str, redactor: Redactor) -> int | None:
    """Inside a transaction: set the cancel flag of a live run, and finish it
    (`cancelled`, its `done` event appended, its credentials cleared) if no
    worker holds a lease. The run's last_seq when it was finished here, None
    when a worker must. The reason is stored redacted."""
    reason = redactor.text(reason)
    done = {"type": "done", "stop_reason": reason, "cancelled": True}
    params = _rows([done], [], redactor=redactor)
    params.update(run_id=run_id, reason=reason)
    with connection.cursor() as cur:
        cur.execute(_CANCEL_FLAG_SQL, [reason, run_id])
        cur.execute(_CANCEL_FINISH_SQL, params)
        row = cur.fetchone()
    return None if row is None else int(row[0])


@dataclass(frozen=True)
class InputQueued:
    accepted: bool  # False: the steering queue was full (nothing written)
    woke: bool  # this input flipped an `awaiting_input` run back to running
    step: int


def input_queue(*, run_id: str, text: str, cap: int) -> InputQueued:
    """Queue steering text (redacted) unless `cap` inputs are pending; exactly
    one caller wakes a run parked at `awaiting_input`. One transaction."""

    with transaction.atomic():
        # Row lock: the cap check and the counter move together.
        locked = Run.objects.select_for_update().get(id=run_id)
        if locked.pending_inputs >= cap:
            return InputQueued(False, False, locked.step)
        redactor = run_redactor_of(run_id=run_id, sealed=locked.credentials_sealed)
        RunInput.objects.create(run_id=run_id, text=redactor.text(text))
        Run.objects.filter(id=run_id).update(pending_inputs=F("pending_inputs") + 1)
        # Conditional wake: exactly one caller flips awaiting_input -> running.
        woke = Run.objects.filter(id=run_id, status=RunStatus.AWAITING_INPUT).update(
            status=RunStatus.RUNNING, updated_at=timezone.now()
        )
    return InputQueued(True, bool(woke), locked.step)


def runtime_state_lock() -> str:
    """Inside a transaction: the runtime state, its row locked (created if missing)."""

    state, _ = RuntimeState.objects.select_for_update().get_or_create(id=1)
    return state.state


def runtime_state_set(state: str, *, only_from: str | None = None) -> bool:
    """Set the runtime state (only if it is `only_from`, when given); whether it was set."""

    rows = RuntimeState.objects.filter(id=1)
    if only_from is not None:
        rows = rows.filter(state=only_from)
    return bool(rows.update(state=state, updated_at=timezone.now()))


def runs_pause_unleased() -> int:
    """Park every runnable run no worker holds at `paused`; bumping lease_token
    turns their queued doorbells into no-ops. Leases are compared with
    Postgres's clock, as the claim sets them."""

    now = Now()
    return Run.objects.filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now), status__in=RUNNABLE).update(
        status=RunStatus.PAUSED, updated_at=now, lease_token=F("lease_token") + 1
    )


def runs_resume_paused() -> list[tuple[str, int]]:
    """Inside a transaction: every paused run back to running; their (id, step) doorbells."""

    # No SKIP LOCKED: a paused run that is locked right now must still be resumed.
    resumed = list(Run.objects.select_for_update().filter(status=RunStatus.PAUSED).values_list("id", "step"))
    Run.objects.filter(id__in=[r for r, _ in resumed]).update(status=RunStatus.RUNNING, updated_at=timezone.now())
    return resumed


def runs_stale_release(*, grace_seconds: float, limit: int = 1000) -> list[tuple[str, int]]:
    """Inside a transaction: runnable runs whose lease expired, or that sat
    unleased (or armed, no worker having adopted it: apps.runs.store.adopt) past
    the grace, lose their lease and get `updated_at` now (one doorbell per grace
    period); their (id, step). Postgres's clock throughout."""

    now = Now()
    grace = timedelta(seconds=grace_seconds)
    # SKIP LOCKED: several beat/sweeper instances never requeue the same run twice.
    stale = list(
        Run.objects.select_for_update(skip_locked=True)
        .filter(
            Q(lease_until__lt=now)
            | Q(Q(lease_until__isnull=True) | Q(lease_owner=""))
            & Q(updated_at__lt=ExpressionWrapper(now - grace, DateTimeField())),
            status__in=RUNNABLE,
        )
        .values_list("id", "step")[:limit]
    )
    if stale:
        Run.objects.filter(id__in=[r for r, _ in stale]).update(updated_at=now, lease_until=None, lease_owner="")
    return stale


def child_report_claim(*, child_id: str) -> bool:
    """Compare-and-set: True for the first report of a terminal child only."""

    claimed = Run.objects.filter(
        id=child_id, reported_to_parent=False, status__in=TERMINAL, parent__isnull=False
    ).update(reported_to_parent=True)
    return bool(claimed)


# Conditional on `failed`: two retries of one run re-open it once; bumping lease_token
# voids any doorbell of the failed run still in flight.
_RETRY_SQL = f"""
WITH d AS (SELECT %(rows)s::jsonb AS j), rt AS (
  UPDATE runs_run SET status = '{RunStatus.RUNNING.value}', error = '', stop_reason = '', completed_at = NULL,
    attempts = 0, lease_owner = '', lease_until = NULL, lease_token = lease_token + 1,
    cancel_requested = false, cancel_reason = '', turn_cancel_requested = false, updated_at = now(),
    {_advance("%(n_e)s")}
  WHERE id = %(run_id)s AND status = '{RunStatus.FAILED.value}'
  RETURNING id, step, last_seq, {_bases("%(n_e)s")}
), {_append(run="rt", sources="rt, d", rows="d.j", step="rt.step", transcript=False)}
SELECT step, last_seq FROM rt
"""


def retry_failed(*, run_id: str, event: dict[str, Any], redactor: Redactor) -> tuple[int, int] | None:
    """Re-open a `failed` run at its last committed step (its transcript as
    committed; the failed step's error event stays in its history), appending
    `event`. (step, last_seq) to ring and notify, None when the run was not
    `failed` (nothing written)."""
    params = _rows([event], [], redactor=redactor)
    params["run_id"] = run_id
    with connection.cursor() as cur:
        cur.execute(_RETRY_SQL, params)
        row = cur.fetchone()
    return None if row is None else (int(row[0]), int(row[1]))
