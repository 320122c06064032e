"""The engine's hot writes (part of apps/runs/store/, the one package that
writes the runs app's tables): two writes per iteration, each one statement
in autocommit, prepared by their text:
- `claim`: compare-and-set of the lease (UPDATE ... RETURNING the run, with
  its transcript aggregated in the same round trip);
- `commit_step`: ONE statement whose fenced UPDATE of the run feeds writable
  CTEs that append transcript rows and events, close inputs and record the
  step's tool calls (finished, or started for a call that parked or spawned);
  the rows travel as one JSONB parameter unpacked in SQL. A lost fence
  returns no run row, so the CTEs insert nothing: the whole step lands or
  none of it does.
Events and transcript rows are appended by the append primitive (store.append).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.conf import settings
from django.db import OperationalError, connection

from apps.core.redact import Redactor
from apps.core.spend import LIMITS_GENERATION_SQL
from apps.gateway.services import usage_run_entries_insert_sql
from apps.runs.statuses import PARKED, RUNNABLE, RunStatus, RuntimeStateValue, ToolCallStatus
from apps.runs.store.append import _advance, _append, _bases, _in, _json, _redacted

log = logging.getLogger("loomcycle.engine")

_CLAIM_COLUMNS = (
    "id",
    "agent_id",
    "session_id",
    "tenant_id",
    "user_id",
    "agent_name",
    "agent_def_id",
    "agent_def_sha256",
    "parent_id",
    "status",
    "step",
    "attempts",
    "lease_token",
    "cancel_requested",
    "cancel_reason",
    "turn_cancel_requested",
    "provider",
    "model",
    "system",
    "max_tokens",
    "interactive",
    "max_iterations",
    "tools",
    "usage",
    "last_seq",
    "transcript_len",
    "pending_inputs",
    "depth",
    "routing",
    "candidate_idx",
    "fallbacks",
    "credentials_sealed",
    "allowed_hosts",
    "volumes",
    "notify_finished",
    "trace_context",
    "session_turn",
    "replays_session",
)


# The claim commits asynchronously (no WAL flush of its own): the step commit is
# synchronous and WAL is sequential, so flushing it flushes the claim too. After a
# Postgres crash either both survive, or the step is lost with its claim and the
# iteration repeats, as after any crash.
_ASYNC_COMMIT = "SELECT set_config('synchronous_commit', 'off', true) AS a"

# The run's first claim (started_at set in this very transaction) appends `started`
# before the provider call, as loomcycle does; a redelivered claim does not.
_CLAIM_SQL = f"""
WITH s AS ({_ASYNC_COMMIT}), c AS (
  UPDATE runs_run SET
    status = CASE WHEN status = '{RunStatus.QUEUED.value}' THEN '{RunStatus.RUNNING.value}' ELSE status END,
    {_advance("(started_at IS NULL)::int")},
    started_at = COALESCE(started_at, now()),
    -- taking an armed lease no worker owns (its doorbell found Redis away, or one without its token)
    -- counts an attempt too: an adopter may have started the step already
    attempts = attempts + 1,
    lease_owner = %(owner)s,
    lease_until = now() + make_interval(secs => %(lease)s),
    lease_token = lease_token + 1,
    last_heartbeat_at = now(),
    updated_at = now()
  WHERE id = %(id)s AND step = %(step)s AND status IN ({_in(RUNNABLE)})
    AND (lease_until IS NULL OR lease_until < now() OR lease_owner = '')
  RETURNING {", ".join(_CLAIM_COLUMNS)}, started_at = now() AS first_claim, {_bases("(started_at = now())::int")}
), st AS (SELECT c.*, CASE WHEN c.first_claim THEN '{{"e": [{{"type": "started"}}]}}'::jsonb END AS j FROM c),
{_append(run="st", sources="st", rows="st.j", step="0", transcript=False, version="%(version)s")}
SELECT {", ".join(f"c.{col}" for col in _CLAIM_COLUMNS)}, c.first_claim, {LIMITS_GENERATION_SQL},
  COALESCE((SELECT state FROM runs_runtimestate WHERE id = 1), '{RuntimeStateValue.RUNNING.value}'),
  (SELECT COALESCE(json_agg(json_build_array(t.role, t.content) ORDER BY t.idx), '[]')
   FROM runs_transcriptentry t WHERE t.run_id = c.id)
FROM c, s
"""

# The statuses a step commit can park a run in: the parks less `waiting_slot` and
# `waiting_session`, which only run creation sets.
PARKED_STATUSES = tuple(s.value for s in PARKED if s not in (RunStatus.WAITING_SLOT, RunStatus.WAITING_SESSION))

# A park is not committed while input or a cancel is already waiting: such a run
# commits `running` and the engine rings its doorbell (no wake-up is lost; the
# values are those of the row as this UPDATE sees it, after any writer it waited for).
_COMMITTED_STATUS = f"""CASE
      WHEN %(status)s = '{RunStatus.AWAITING_INPUT.value}' AND pending_inputs > %(consumed)s
        THEN '{RunStatus.RUNNING.value}'
      WHEN %(status)s IN ({_in(PARKED_STATUSES)}) AND cancel_requested THEN '{RunStatus.RUNNING.value}'
      ELSE %(status)s END"""

# Whether the commit arms the lease of the step the engine rings right after it: the
# committed status is `running` and the engine rings (it meant to, or a park turned into a
# doorbell). Armed: the next token, unowned until adopted (docs/architecture.md, "Lease adoption").
_RUNNING = RunStatus.RUNNING.value
_ARMS = f"(({_COMMITTED_STATUS}) = '{_RUNNING}' AND (%(requeue)s OR %(status)s <> '{_RUNNING}'))"

_COMMIT_SQL = f"""
WITH d AS (SELECT %(rows)s::jsonb AS j),
r AS (
  UPDATE runs_run SET
    status = {_COMMITTED_STATUS},
    -- the adoption of an armed lease is counted here: a lost adopter's successor claims attempt 2
    attempts = CASE WHEN {_ARMS} THEN 1 ELSE 0 END, lease_owner = '',
    lease_until = CASE WHEN {_ARMS} THEN now() + make_interval(secs => %(lease)s) END,
    -- a commit that arms, or leaves the step where it was, moves the token on: whoever still
    -- holds this one (an adopter doubled by a Redis that lost its keys) can commit nothing
    lease_token = lease_token + CASE WHEN {_ARMS} OR NOT %(advance)s THEN 1 ELSE 0 END,
    -- a step that parks for input ended its turn: a turn-cancel still pending has nothing left to stop
    turn_cancel_requested = turn_cancel_requested AND %(status)s <> '{RunStatus.AWAITING_INPUT.value}',
    step = %(new_step)s, {_advance("%(n_e)s", "%(n_t)s")},
    pending_inputs = pending_inputs - %(consumed)s, pending_calls = %(pending_calls)s,
    usage = COALESCE(%(usage)s::jsonb, usage),
    provider = COALESCE(%(provider)s, provider), model = COALESCE(%(model)s, model),
    candidate_idx = COALESCE(%(candidate_idx)s, candidate_idx), fallbacks = COALESCE(%(fallbacks)s, fallbacks),
    stop_reason = CASE WHEN %(set_stop)s THEN %(stop_reason)s ELSE stop_reason END,
    error = CASE WHEN %(finish)s THEN %(error)s ELSE error END,
    completed_at = CASE WHEN %(finish)s THEN now() ELSE completed_at END,
    -- a terminal run's credentials are gone: nothing it does later needs them
    credentials_sealed = CASE WHEN %(finish)s THEN '' ELSE credentials_sealed END,
    updated_at = now(), last_heartbeat_at = now()
  WHERE id = %(id)s AND step = %(step)s AND lease_token = %(token)s
  RETURNING id, status, lease_until IS NOT NULL AS armed, {_bases("%(n_e)s", "%(n_t)s")}
), {_append(run="r", sources="r, d", rows="d.j", step="%(step)s", version="%(version)s")}, i AS (
  UPDATE runs_runinput SET consumed_step = %(step)s
  FROM r, d WHERE runs_runinput.run_id = r.id
    AND runs_runinput.id IN (SELECT (jsonb_array_elements_text(d.j->'i'))::bigint)
), u AS (
  -- the usage/cost ledger: one row per provider call of this step (apps.gateway owns the table)
  {
    usage_run_entries_insert_sql(
        entries="d.j->'u'",
        sources="r, d",
        run_id="r.id",
        step="%(step)s",
        tenant_id="%(tenant_id)s",
        user_id="%(user_id)s",
    )
}
), c AS (
  -- the step's tool calls, in the model's order: [call_id, name, input, finished, is_error]
  -- (a record a rolling deploy's older worker started is closed, not repeated)
  INSERT INTO runs_toolcallrecord (run_id, step, call_id, name, input, status, is_error, started_at, finished_at)
  SELECT r.id, %(step)s, x.v->>0, x.v->>1, x.v->2,
    CASE WHEN (x.v->>3)::boolean THEN '{ToolCallStatus.FINISHED.value}' ELSE '{ToolCallStatus.STARTED.value}' END,
    (x.v->>4)::boolean, to_timestamp(%(tools_at)s),
    CASE WHEN (x.v->>3)::boolean THEN now() END
  FROM r, d, jsonb_array_elements(d.j->'c') WITH ORDINALITY AS x(v, n)
  ORDER BY x.n
  ON CONFLICT (run_id, step, call_id) DO UPDATE SET
    status = EXCLUDED.status, is_error = EXCLUDED.is_error, finished_at = EXCLUDED.finished_at
)
SELECT status, armed FROM r
"""


@dataclass
class ClaimedRun:
    """The run row as the claim returned it (the iteration's view of the run)."""

    id: str
    agent_id: str
    session_id: str
    tenant_id: str
    user_id: str
    agent_name: str
    agent_def_id: str
    agent_def_sha256: str
    parent_id: str | None
    status: str
    step: int
    attempts: int
    lease_token: int
    cancel_requested: bool
    cancel_reason: str
    turn_cancel_requested: bool  # apps.runs.engine.turncancel: stop this turn, re-park at awaiting_input
    provider: str
    model: str
    system: list[str]
    max_tokens: int
    interactive: bool
    max_iterations: int
    tools: list[str]
    usage: dict[str, Any]
    last_seq: int
    transcript_len: int
    pending_inputs: int
    depth: int
    routing: dict[str, Any]
    candidate_idx: int
    fallbacks: int
    credentials_sealed: str  # apps.runs.credentials; opened by the engine, never logged
    allowed_hosts: list[str]
    volumes: list[dict[str, Any]] = field(default_factory=list)
    notify_finished: bool = False
    trace_context: str = ""  # the run's root span (apps.runs.tracing), '' when it was not traced
    session_turn: int = 0  # its place in its session (apps.runs.sessions.promotion)
    replays_session: bool = False  # its model sees the session's earlier turns first
    first_claim: bool = False
    limits_generation: int = 0  # apps.core.spend.LIMITS_GENERATION_SQL, in the claim's snapshot
    runtime_state: str = "running"
    transcript: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    # Opened from credentials_sealed by the engine for this iteration only (memory, never stored).
    credentials: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Switched:
    """The candidate a provider fallback moved the run to (committed with the step)."""

    provider: str
    model: str
    candidate_idx: int
    fallbacks: int


@dataclass
class StepRows:
    """What `commit_step` writes besides the run row itself."""

    transcript: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    consumed_inputs: list[int] = field(default_factory=list)
    finished_calls: list[tuple[str, bool]] = field(default_factory=list)
    tool_batch: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (call_id, name, input)
    tools_started_at: float = 0.0  # time.time() when the batch began: the records' started_at
    # usage ledger rows: {provider, model, input_tokens, output_tokens,
    # cache_creation_input_tokens, cache_read_input_tokens, cost_usd (str | None)}
    ledger: list[dict[str, Any]] = field(default_factory=list)


_NEVER_AUTOMATICALLY = 2**31 - 1


@contextmanager
def _prepared() -> Iterator[psycopg.Cursor[Any]]:
    """A cursor for the engine's three hot statements, executed with
    `prepare=True`: each becomes a prepared statement of the pooled connection,
    and the session's `plan_cache_mode=force_generic_plan` (settings: nothing
    else on it is prepared; Django runs with prepare_threshold=None) plans it
    once per connection. Unprepared, Postgres planned the step commit on every
    call, ~3 ms of CPU, more than it took to execute.

    Outside a transaction, with Django's connection closed (the engine hands it
    back before every provider call), the cursor is on a connection borrowed
    from Django's psycopg pool for just this statement: Django's connect/close
    cycle around a pooled connection costs ~80 us of CPU, the pool's ~25.
    Inside `transaction.atomic()`, or with Django's connection open, it is
    Django's connection (same session, same transaction)."""
    pool: Any = None
    if not connection.in_atomic_block and connection.connection is None:
        pool = getattr(connection, "pool", None)  # Django's psycopg pool (settings: always configured)
    if pool is None:
        connection.ensure_connection()
        raw = connection.connection
        _allow_explicit_prepare(raw)
        with psycopg.Cursor(raw) as cur:
            yield cur
        return
    if pool.closed:  # as Django's get_new_connection: the first use opens it
        pool.open()
    with pool.connection() as raw:
        _allow_explicit_prepare(raw)
        with psycopg.Cursor(raw) as cur:
            yield cur


def _allow_explicit_prepare(raw: Any) -> None:
    if raw.prepare_threshold is None:  # Django's default: never prepare. Only explicit prepare=True calls do now.
        raw.prepare_threshold = _NEVER_AUTOMATICALLY


def _hot(sql: str, params: Any, *, landed: Callable[[], Any] | None = None) -> Any:
    """Execute one of the engine's statements (the three hot ones, and the
    hand-back after a lost connection) and return its first row.

    A lost connection (a Postgres restart, a terminated backend) is not the
    run's fault: the statement is tried again on a fresh connection, for up to
    a lease, after dropping the pool's dead idle connections (psycopg's
    `pool.check`, only after such an error: checking at every checkout costs a
    round trip, ~70 us of CPU). `landed`, if given, tells after an error
    whether the statement had committed anyway (its reply was lost). Inside a
    transaction nothing is retried: the transaction is gone."""
    delay, deadline, failed = 0.05, time.monotonic() + settings.LOOMCYCLE.lease_seconds, False
    while True:
        try:
            if failed and landed is not None and (row := landed()) is not None:
                return row
            with _prepared() as cur:
                cur.execute(sql, params, prepare=True)
                return cur.fetchone() if cur.description else None
        except (psycopg.OperationalError, OperationalError) as exc:  # raw (pool) or Django-wrapped
            if connection.in_atomic_block or time.monotonic() + delay > deadline:
                raise
            log.warning("engine statement lost its connection (%s); retrying on a fresh one", exc)
            failed = True
            pool_purge()
            time.sleep(delay)  # back-off while the server comes back
            delay = min(delay * 2, 1.0)


def pool_purge() -> None:
    """Drop this thread's Django connection and the pool's dead idle ones (after a connection error)."""
    if connection.connection is not None:
        connection.close()  # a broken connection goes back to the pool, which discards it
    pool = getattr(connection, "pool", None)
    if pool is not None and not pool.closed:
        pool.check()


def claim(*, run_id: str, step: int, owner: str, lease_seconds: float) -> ClaimedRun | None:
    """Compare-and-set: None means a duplicate/stale doorbell or a live lease elsewhere
    (an armed lease no worker has adopted is not one: the claim takes it, apps.runs.store.adopt)."""
    params = {"owner": owner, "lease": lease_seconds, "id": run_id, "step": step, "version": _version()}
    row = _hot(_CLAIM_SQL, params)
    return None if row is None else claimed_of(row)


def claimed_of(row: Any) -> ClaimedRun:
    """A ClaimedRun from a row of the claim's shape (the adoption's SELECT returns the same)."""
    values = dict(zip((*_CLAIM_COLUMNS, "first_claim"), row, strict=False))
    for key in ("system", "tools", "usage", "routing", "allowed_hosts", "volumes"):
        values[key] = _json(values[key])
    transcript = [(role, content) for role, content in _json(row[-1])]
    return ClaimedRun(**values, limits_generation=row[-3], runtime_state=row[-2], transcript=transcript)


# The claim handed back after the database went away mid-iteration: the lease
# released and, when `free`, the attempt not counted (it was the database's failure,
# not the iteration's), fenced by the token; the token moves on, so nothing this
# attempt still had in flight can commit.
_HAND_BACK_SQL = """
UPDATE runs_run SET attempts = GREATEST(attempts - %(free)s::int, 0), lease_owner = '', lease_until = NULL,
  lease_token = lease_token + 1, updated_at = now()
WHERE id = %(id)s AND step = %(step)s AND lease_token = %(token)s
RETURNING step
"""


def claim_hand_back(*, run_id: str, step: int, token: int, free: bool) -> bool:
    """Release a claim whose iteration lost the database connection, its attempt
    not counted when `free` (retried on fresh connections for up to a lease, as
    every engine statement). False when the fence had moved on (nothing written)."""
    params = {"id": run_id, "step": step, "token": token, "free": int(free)}
    return _hot(_HAND_BACK_SQL, params) is not None


def _version() -> str:
    """The code version this process's iteration events record (LOOMCYCLE_WORKER_VERSION)."""
    return settings.LOOMCYCLE.worker_version


def pending_inputs(*, run_id: str) -> list[tuple[int, str, str]]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, text, source FROM runs_runinput WHERE run_id = %s AND consumed_step IS NULL ORDER BY id",
            [run_id],
        )
        return [(int(i), str(t), str(s)) for i, t, s in cur.fetchall()]


def commit_step(
    *,
    run: ClaimedRun,
    status: str,
    advance: bool,
    finish: bool,
    requeue: bool,
    stop_reason: str,
    error: str,
    usage: dict[str, Any] | None,
    rows: StepRows,
    pending_calls: int = 0,
    switched: Switched | None = None,
    redactor: Redactor,
) -> tuple[str, bool] | None:
    """The fenced step commit: the status committed (`running` instead of a park
    when input or a cancel was already waiting) and whether it armed the lease of
    the step the engine rings next (`requeue`: the engine means to ring it; the token
    armed is the run's next one), None when the fence was lost (nothing written).
    `switched`: set after a provider fallback. Events,
    transcript rows, the error and the stop reason are stored redacted; a
    finishing commit clears the run's sealed credentials."""
    packed = {
        **_redacted(redactor, rows.events, rows.transcript),
        "i": rows.consumed_inputs,
        "c": _tool_records(rows, redactor),
        "u": rows.ledger,
    }
    params: dict[str, Any] = {
        "id": run.id,
        "step": run.step,
        "token": run.lease_token,
        "status": status,
        "advance": advance,
        "requeue": requeue,
        "lease": settings.LOOMCYCLE.lease_seconds,
        "new_step": run.step + 1 if advance else run.step,
        "n_e": len(rows.events),
        "n_t": len(rows.transcript),
        "consumed": len(rows.consumed_inputs),
        "usage": json.dumps(usage) if usage is not None else None,
        "set_stop": bool(stop_reason) or finish,
        "stop_reason": redactor.text(stop_reason),
        "finish": finish,
        "error": redactor.text(error),
        "tenant_id": run.tenant_id,
        "user_id": run.user_id,
        "pending_calls": pending_calls,
        "rows": json.dumps(packed),
        "provider": switched.provider if switched else None,
        "model": switched.model if switched else None,
        "candidate_idx": switched.candidate_idx if switched else None,
        "fallbacks": switched.fallbacks if switched else None,
        "version": _version(),
        "tools_at": rows.tools_started_at or time.time(),
    }
    landed = functools.partial(_step_landed, run, params["new_step"]) if advance else None
    row = _hot(_COMMIT_SQL, params, landed=landed)
    return (str(row[0]), bool(row[1])) if row else None


def _tool_records(rows: StepRows, redactor: Redactor) -> list[list[Any]]:
    """The batch's records (inputs redacted): finished with the step, or started when parked or spawned."""
    finished = dict(rows.finished_calls)
    return [
        [call_id, name, redactor.value(data), call_id in finished, finished.get(call_id, False)]
        for call_id, name, data in rows.tool_batch
    ]


def _step_landed(run: ClaimedRun, new_step: int) -> Any:
    """After a lost connection: the run as our step commit leaves it (step
    advanced, unowned, and either our token with no lease or the next one armed),
    or None. Only a commit with this token advances the step with it: a sweeper
    or a later claim changes one or the other (a later claim's commit leaves its
    own token, ours + 1, unarmed, or arms ours + 2)."""
    with _prepared() as cur:
        cur.execute(
            "SELECT status, lease_until IS NOT NULL FROM runs_run WHERE id = %s AND step = %s AND lease_owner = ''"
            " AND ((lease_token = %s AND lease_until IS NULL) OR (lease_token = %s AND lease_until IS NOT NULL))",
            [run.id, new_step, run.lease_token, run.lease_token + 1],
        )
        return cur.fetchone()
