"""The one module that writes the runs app's tables (`runs_*`): run rows,
their events, transcript, inputs, tool-call records and the runtime state.
Other modules, and other apps, call the functions here (writes) or
apps.runs.selectors (reads); tests/test_architecture.py checks it.

Every event or transcript row is appended by ONE primitive (`_advance`,
`_bases`, `_append`): the statement that updates (or inserts) the run row
moves its `last_seq`/`transcript_len` past the new rows, and the rows take
their seq/idx from the counters that very row returns. The claim, the step
commit, an answer to a parked call, a cancel and run creation all use it, so
seqs stay consecutive, without duplicates, whichever of them races: each
writes under the run row's lock, taken by its own UPDATE. Statuses in the SQL
are built once from apps.runs.statuses.

Three writes per tool-calling iteration, each one statement in autocommit:
- `claim`: compare-and-set of the lease (UPDATE ... RETURNING the run, with
  its transcript aggregated in the same round trip);
- `record_tool_starts`: the started records (INSERT ... ON CONFLICT DO NOTHING);
- `commit_step`: ONE statement whose fenced UPDATE of the run feeds writable
  CTEs that append transcript rows and events and close inputs and tool
  calls; the rows travel as one JSONB parameter unpacked in SQL. A lost
  fence returns no run row, so the CTEs insert nothing: the whole step
  lands or none of it does.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q
from django.db.models.functions import Now
from django.utils import timezone

from apps.gateway.services import usage_run_entries_insert_sql
from apps.runs.statuses import (
    ANSWERABLE,
    PARKED,
    RUNNABLE,
    TERMINAL,
    RunStatus,
    RuntimeStateValue,
    ToolCallStatus,
)

if TYPE_CHECKING:
    from apps.runs.models import Run

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
)


def _in(statuses: tuple[str, ...]) -> str:
    """A SQL list of status literals, built once from the enum (never typed in SQL)."""
    return ", ".join(f"'{RunStatus(s).value}'" for s in statuses)


def _advance(n_events: str, n_transcript: str = "0") -> str:
    """The append primitive, 1/3: SET items of the run row's UPDATE that move its
    counters past the rows appended (SQL counts, evaluated on the old row)."""
    return f"last_seq = last_seq + {n_events}, transcript_len = transcript_len + {n_transcript}"


def _bases(n_events: str, n_transcript: str = "0") -> str:
    """2/3: RETURNING items, the counters before this append (RETURNING sees the
    updated row, so the counts are subtracted again)."""
    return f"last_seq - {n_events} AS seq_base, transcript_len - {n_transcript} AS idx_base"


def _append(*, run: str, sources: str, rows: str, step: str, at: str = "now()", transcript: bool = True) -> str:
    """3/3: writable CTEs `ev` (and `tx`) inserting the events `{rows}->'e'` at
    seq seq_base+1.. and the transcript rows `{rows}->'t'` ({role, content}) at
    idx idx_base+0.., where `run` is the CTE of the run row this statement
    updated or inserted (it returns id, seq_base, idx_base: `_bases`). No run
    row (a lost fence or compare-and-set) appends nothing."""
    ctes = f"""ev AS (
  INSERT INTO runs_runevent (run_id, seq, step, type, payload, created_at)
  SELECT {run}.id, {run}.seq_base + x.n, {step}, x.v->>'type', x.v, {at}
  FROM {sources}, jsonb_array_elements({rows}->'e') WITH ORDINALITY AS x(v, n)
)"""
    if transcript:
        ctes += f""", tx AS (
  INSERT INTO runs_transcriptentry (run_id, idx, step, role, content, created_at)
  SELECT {run}.id, {run}.idx_base + x.n - 1, {step}, x.v->>'role', x.v->'content', {at}
  FROM {sources}, jsonb_array_elements({rows}->'t') WITH ORDINALITY AS x(v, n)
)"""
    return ctes


def _rows(events: list[dict[str, Any]], transcript: list[tuple[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """The parameters of an append: its rows (one JSONB) and their counts."""
    packed = {"e": events, "t": [{"role": role, "content": content} for role, content in transcript]}
    return {"rows": json.dumps(packed), "n_e": len(events), "n_t": len(transcript)}


# The claim and the tool-start records commit asynchronously (no WAL flush of
# their own): the step commit is synchronous and WAL is sequential, so flushing
# it flushes them too. After a Postgres crash either all three survive, or the
# step is lost with them and the iteration repeats, as after any crash.
_ASYNC_COMMIT = "SELECT set_config('synchronous_commit', 'off', true) AS a"

# The run's first claim (started_at set in this very transaction) appends `started`
# before the provider call, as loomcycle does; a redelivered claim does not.
_CLAIM_SQL = f"""
WITH s AS ({_ASYNC_COMMIT}), c AS (
  UPDATE runs_run SET
    status = CASE WHEN status = '{RunStatus.QUEUED.value}' THEN '{RunStatus.RUNNING.value}' ELSE status END,
    {_advance("(started_at IS NULL)::int")},
    started_at = COALESCE(started_at, now()),
    attempts = attempts + 1,
    lease_owner = %(owner)s,
    lease_until = now() + make_interval(secs => %(lease)s),
    lease_token = lease_token + 1,
    last_heartbeat_at = now(),
    updated_at = now()
  WHERE id = %(id)s AND step = %(step)s AND status IN ({_in(RUNNABLE)})
    AND (lease_until IS NULL OR lease_until < now())
  RETURNING {", ".join(_CLAIM_COLUMNS)}, started_at = now() AS first_claim, {_bases("(started_at = now())::int")}
), st AS (SELECT c.*, CASE WHEN c.first_claim THEN '{{"e": [{{"type": "started"}}]}}'::jsonb END AS j FROM c),
{_append(run="st", sources="st", rows="st.j", step="0", transcript=False)}
SELECT {", ".join(f"c.{col}" for col in _CLAIM_COLUMNS)}, c.first_claim,
  COALESCE((SELECT state FROM runs_runtimestate WHERE id = 1), '{RuntimeStateValue.RUNNING.value}'),
  (SELECT COALESCE(json_agg(json_build_array(t.role, t.content) ORDER BY t.idx), '[]')
   FROM runs_transcriptentry t WHERE t.run_id = c.id)
FROM c, s
"""

_TOOL_STARTS_SQL = f"""
WITH s AS ({_ASYNC_COMMIT})
INSERT INTO runs_toolcallrecord (run_id, step, call_id, name, input, status, is_error, started_at)
SELECT %s, %s, x.v->>0, x.v->>1, x.v->2, '{ToolCallStatus.STARTED.value}', false, now()
FROM s, jsonb_array_elements(%s::jsonb) AS x(v)
ON CONFLICT (run_id, step, call_id) DO NOTHING
"""

# The statuses a step commit can park a run in: the parks less `waiting_slot`,
# which only run creation sets.
PARKED_STATUSES = tuple(s.value for s in PARKED if s != RunStatus.WAITING_SLOT)

_COMMIT_SQL = f"""
WITH d AS (SELECT %(rows)s::jsonb AS j),
r AS (
  UPDATE runs_run SET
    -- A park is not committed while input or a cancel is already waiting: such a run
    -- commits `running` and the engine rings its doorbell (no wake-up is lost; the
    -- values are those of the row as this UPDATE sees it, after any writer it waited for).
    status = CASE
      WHEN %(status)s = '{RunStatus.AWAITING_INPUT.value}' AND pending_inputs > %(consumed)s
        THEN '{RunStatus.RUNNING.value}'
      WHEN %(status)s IN ({_in(PARKED_STATUSES)}) AND cancel_requested THEN '{RunStatus.RUNNING.value}'
      ELSE %(status)s END,
    attempts = 0, lease_owner = '', lease_until = NULL,
    step = %(new_step)s, {_advance("%(n_e)s", "%(n_t)s")},
    pending_inputs = pending_inputs - %(consumed)s, pending_calls = %(pending_calls)s,
    usage = COALESCE(%(usage)s::jsonb, usage),
    provider = COALESCE(%(provider)s, provider), model = COALESCE(%(model)s, model),
    candidate_idx = COALESCE(%(candidate_idx)s, candidate_idx), fallbacks = COALESCE(%(fallbacks)s, fallbacks),
    stop_reason = CASE WHEN %(set_stop)s THEN %(stop_reason)s ELSE stop_reason END,
    error = CASE WHEN %(finish)s THEN %(error)s ELSE error END,
    completed_at = CASE WHEN %(finish)s THEN now() ELSE completed_at END,
    updated_at = now(), last_heartbeat_at = now()
  WHERE id = %(id)s AND step = %(step)s AND lease_token = %(token)s
  RETURNING id, status, {_bases("%(n_e)s", "%(n_t)s")}
), {_append(run="r", sources="r, d", rows="d.j", step="%(step)s")}, i AS (
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
  UPDATE runs_toolcallrecord SET status = '{ToolCallStatus.FINISHED.value}', is_error = (x.v->>1)::boolean,
    finished_at = now()
  FROM r, d, jsonb_array_elements(d.j->'c') AS x(v)
  WHERE runs_toolcallrecord.run_id = r.id AND runs_toolcallrecord.step = %(step)s
    AND runs_toolcallrecord.call_id = x.v->>0
)
SELECT status FROM r
"""


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


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
    first_claim: bool = False
    runtime_state: str = "running"
    transcript: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)


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
    """Execute one of the three hot statements and return its first row.

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
    """Compare-and-set: None means a duplicate/stale doorbell or a live lease elsewhere."""
    row = _hot(_CLAIM_SQL, {"owner": owner, "lease": lease_seconds, "id": run_id, "step": step})
    if row is None:
        return None
    values = dict(zip((*_CLAIM_COLUMNS, "first_claim"), row, strict=False))
    for key in ("system", "tools", "usage", "routing"):
        values[key] = _json(values[key])
    transcript = [(role, content) for role, content in _json(row[-1])]
    return ClaimedRun(**values, runtime_state=row[-2], transcript=transcript)


def pending_inputs(*, run_id: str) -> list[tuple[int, str, str]]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, text, source FROM runs_runinput WHERE run_id = %s AND consumed_step IS NULL ORDER BY id",
            [run_id],
        )
        return [(int(i), str(t), str(s)) for i, t, s in cur.fetchall()]


def record_tool_starts(*, run_id: str, step: int, calls: list[tuple[str, str, dict[str, Any]]]) -> None:
    """Recorded before the tools run; a redelivery repeats the same (run, step, call_id) keys."""
    _hot(_TOOL_STARTS_SQL, [run_id, step, json.dumps([list(c) for c in calls])])


def commit_step(
    *,
    run: ClaimedRun,
    status: str,
    advance: bool,
    finish: bool,
    stop_reason: str,
    error: str,
    usage: dict[str, Any] | None,
    rows: StepRows,
    pending_calls: int = 0,
    switched: Switched | None = None,
) -> str | None:
    """The fenced step commit: the status committed (`running` instead of a park
    when input or a cancel was already waiting), None when the fence was lost
    (nothing written). `switched`: set after a provider fallback."""
    packed = {
        "t": [{"role": role, "content": content} for role, content in rows.transcript],
        "e": rows.events,
        "i": rows.consumed_inputs,
        "c": rows.finished_calls,
        "u": rows.ledger,
    }
    params: dict[str, Any] = {
        "id": run.id,
        "step": run.step,
        "token": run.lease_token,
        "status": status,
        "new_step": run.step + 1 if advance else run.step,
        "n_e": len(rows.events),
        "n_t": len(rows.transcript),
        "consumed": len(rows.consumed_inputs),
        "usage": json.dumps(usage) if usage is not None else None,
        "set_stop": bool(stop_reason) or finish,
        "stop_reason": stop_reason,
        "finish": finish,
        "error": error,
        "tenant_id": run.tenant_id,
        "user_id": run.user_id,
        "pending_calls": pending_calls,
        "rows": json.dumps(packed),
        "provider": switched.provider if switched else None,
        "model": switched.model if switched else None,
        "candidate_idx": switched.candidate_idx if switched else None,
        "fallbacks": switched.fallbacks if switched else None,
    }
    landed = functools.partial(_step_landed, run, params["new_step"]) if advance else None
    row = _hot(_COMMIT_SQL, params, landed=landed)
    return str(row[0]) if row else None


def _step_landed(run: ClaimedRun, new_step: int) -> Any:
    """After a lost connection: the run as our step commit leaves it (step
    advanced, our token, no lease), or None. Only a commit with this token
    advances the step: a sweeper or a later claim changes one or the other."""
    with _prepared() as cur:
        cur.execute(
            "SELECT status FROM runs_run WHERE id = %s AND step = %s AND lease_token = %s AND lease_owner = ''",
            [run.id, new_step, run.lease_token],
        )
        return cur.fetchone()


@functools.cache
def _insert_run_sql() -> tuple[str, list[Any]]:
    """One statement: the run row (every column of the model, in its order),
    its first transcript row and its first events (the append primitive, on
    the inserted row). Built once per process."""
    from apps.runs.models import Run

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


def insert_run(run: Run, *, first_message: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
    """Insert an unsaved `Run` with its first user message (transcript idx 0)
    and its first events (seq 1..n), in one statement; `run` becomes a saved
    instance with its counters set. The ORM's three INSERTs cost ~1.7 ms of
    CPU, mostly compiling them. Through Django's cursor, so a duplicate
    `agent_id` raises Django's IntegrityError."""
    sql, fields = _insert_run_sql()
    now = timezone.now()
    run.created_at = run.updated_at = now
    run.last_seq, run.transcript_len = len(events), 1  # the row's counters start past its first rows
    params = {f"f{i}": f.get_db_prep_save(getattr(run, f.attname), connection) for i, f in enumerate(fields)}
    params.update(_rows(events, [("user", first_message)]), at=now)
    with connection.cursor() as cur:
        cur.execute(sql, params)
    run._state.adding = False
    run._state.db = connection.alias


# --- Writes outside the iteration: heartbeat, answers, cancel, input, pause, sweeps, admission.

_HEARTBEAT_SQL = """
UPDATE runs_run r SET lease_until = now() + make_interval(secs => %s), last_heartbeat_at = now()
FROM unnest(%s::text[], %s::bigint[]) AS l(id, tok)
WHERE r.id = l.id AND r.lease_token = l.tok AND r.lease_owner = %s
"""


def leases_extend(*, owner: str, lease_seconds: float, leased: list[tuple[str, int]]) -> None:
    """One UPDATE for every run in flight in this process. Fenced: only leases
    `owner` still holds with these tokens are extended."""
    with connection.cursor() as cur:
        cur.execute(_HEARTBEAT_SQL, [lease_seconds, [r for r, _ in leased], [t for _, t in leased], owner])


# The run row locked first (answers to one run are serialised), with the call's
# started record in the same round trip.
_ANSWER_LOCK_SQL = """
SELECT r.status, r.step, rec.id, rec.step, rec.input
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


def answer_lock(*, run_id: str, call_id: str) -> AnswerTarget | None:
    """Inside the answerer's transaction: lock the run row (answers to one run
    are serialised); None when the run is gone or terminal."""
    with connection.cursor() as cur:
        cur.execute(_ANSWER_LOCK_SQL, [call_id, run_id])
        row = cur.fetchone()
    if row is None or row[0] in TERMINAL:
        return None
    _, run_step, record_id, record_step, record_input = row
    if record_id is None:
        return AnswerTarget(run_step, max(run_step - 1, 0), {}, None)
    return AnswerTarget(run_step, record_step, _json(record_input), record_id)


def answer_append(
    *, run_id: str, target: AnswerTarget, events: list[dict[str, Any]], block: dict[str, Any], is_error: bool
) -> tuple[bool, int]:
    """Append an answer under `answer_lock`'s lock: its events, its transcript
    row (`block`, a user turn), the finished record, one pending call fewer.
    Returns (woke: this answer flipped the run back to running, last_seq)."""
    params = _rows(events, [("user", [block])])
    params.update(run_id=run_id, step=target.step, is_error=is_error, record_id=target.record_id)
    with connection.cursor() as cur:
        cur.execute(_ANSWER_SQL, params)
        woke, last_seq = cur.fetchone()
    return bool(woke), int(last_seq)


_CANCEL_FLAG_SQL = f"""
UPDATE runs_run SET cancel_requested = true, cancel_reason = %s WHERE id = %s AND status NOT IN ({_in(TERMINAL)})
"""

# Conditional: only a run no live worker holds is finished here; bumping
# lease_token voids any fence a slow, lease-expired worker still has.
_CANCEL_FINISH_SQL = f"""
WITH d AS (SELECT %(rows)s::jsonb AS j), cnl AS (
  UPDATE runs_run SET status = '{RunStatus.CANCELLED.value}', stop_reason = %(reason)s,
    completed_at = now(), updated_at = now(), lease_owner = '', lease_until = NULL,
    lease_token = lease_token + 1, step = step + 1, {_advance("%(n_e)s")}
  WHERE id = %(run_id)s AND status IN ({_in((*RUNNABLE, *PARKED))})
    AND (lease_until IS NULL OR lease_until < now())
  RETURNING id, last_seq, step - 1 AS cancelled_step, {_bases("%(n_e)s")}
), {_append(run="cnl", sources="cnl, d", rows="d.j", step="cnl.cancelled_step", transcript=False)}
SELECT last_seq FROM cnl
"""


def cancel(*, run_id: str, reason: str) -> int | None:
    """Inside a transaction: set the cancel flag of a live run, and finish it
    (`cancelled`, its `done` event appended) if no worker holds a lease.
    The run's last_seq when it was finished here, None when a worker must."""
    done = {"type": "done", "stop_reason": reason, "cancelled": True}
    params = _rows([done], [])
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
    """Queue steering text unless `cap` inputs are pending; exactly one caller
    wakes a run parked at `awaiting_input`. One transaction."""
    from apps.runs.models import Run, RunInput

    with transaction.atomic():
        # Row lock: the cap check and the counter move together.
        locked = Run.objects.select_for_update().get(id=run_id)
        if locked.pending_inputs >= cap:
            return InputQueued(False, False, locked.step)
        RunInput.objects.create(run_id=run_id, text=text)
        Run.objects.filter(id=run_id).update(pending_inputs=F("pending_inputs") + 1)
        # Conditional wake: exactly one caller flips awaiting_input -> running.
        woke = Run.objects.filter(id=run_id, status=RunStatus.AWAITING_INPUT).update(
            status=RunStatus.RUNNING, updated_at=timezone.now()
        )
    return InputQueued(True, bool(woke), locked.step)


def runtime_state_lock() -> str:
    """Inside a transaction: the runtime state, its row locked (created if missing)."""
    from apps.runs.models import RuntimeState

    state, _ = RuntimeState.objects.select_for_update().get_or_create(id=1)
    return state.state


def runtime_state_set(state: str, *, only_from: str | None = None) -> bool:
    """Set the runtime state (only if it is `only_from`, when given); whether it was set."""
    from apps.runs.models import RuntimeState

    rows = RuntimeState.objects.filter(id=1)
    if only_from is not None:
        rows = rows.filter(state=only_from)
    return bool(rows.update(state=state, updated_at=timezone.now()))


def runs_pause_unleased() -> int:
    """Park every runnable run no worker holds at `paused`; bumping lease_token
    turns their queued doorbells into no-ops. Leases are compared with
    Postgres's clock, as the claim sets them."""
    from apps.runs.models import Run

    now = Now()
    return Run.objects.filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now), status__in=RUNNABLE).update(
        status=RunStatus.PAUSED, updated_at=now, lease_token=F("lease_token") + 1
    )


def runs_resume_paused() -> list[tuple[str, int]]:
    """Inside a transaction: every paused run back to running; their (id, step) doorbells."""
    from apps.runs.models import Run

    # No SKIP LOCKED: a paused run that is locked right now must still be resumed.
    resumed = list(Run.objects.select_for_update().filter(status=RunStatus.PAUSED).values_list("id", "step"))
    Run.objects.filter(id__in=[r for r, _ in resumed]).update(status=RunStatus.RUNNING, updated_at=timezone.now())
    return resumed


def runs_stale_release(*, grace_seconds: float, limit: int = 1000) -> list[tuple[str, int]]:
    """Inside a transaction: runnable runs whose lease expired, or that sat
    unleased past the grace, lose their lease and get `updated_at` now (one
    doorbell per grace period); their (id, step). Postgres's clock throughout."""
    from apps.runs.models import Run

    now = Now()
    grace = timedelta(seconds=grace_seconds)
    # SKIP LOCKED: several beat/sweeper instances never requeue the same run twice.
    stale = list(
        Run.objects.select_for_update(skip_locked=True)
        .filter(
            Q(lease_until__lt=now)
            | Q(lease_until__isnull=True, updated_at__lt=ExpressionWrapper(now - grace, DateTimeField())),
            status__in=RUNNABLE,
        )
        .values_list("id", "step")[:limit]
    )
    if stale:
        Run.objects.filter(id__in=[r for r, _ in stale]).update(updated_at=now, lease_until=None, lease_owner="")
    return stale


def child_report_claim(*, child_id: str) -> bool:
    """Compare-and-set: True for the first report of a terminal child only."""
    from apps.runs.models import Run

    claimed = Run.objects.filter(
        id=child_id, reported_to_parent=False, status__in=TERMINAL, parent__isnull=False
    ).update(reported_to_parent=True)
    return bool(claimed)


# One lock for every admission decision of the cluster (pg_advisory_xact_lock key).
_ADMISSION_LOCK_KEY = 0x6C635F61646D6974  # "lc_admit"

_TOP_LIVE = f"parent_id IS NULL AND NOT (status IN ({_in(TERMINAL)}))"  # the partial index run_top_live

_ADMISSION_COUNT_SQL = f"""
SELECT count(*) FILTER (WHERE status <> '{RunStatus.WAITING_SLOT.value}'),
  count(*) FILTER (WHERE status = '{RunStatus.WAITING_SLOT.value}')
FROM runs_run WHERE {_TOP_LIVE}
"""

# SKIP LOCKED: a waiting row locked by its withdrawal (or a cancel) is not promoted.
# MATERIALIZED: the LIMIT picks its rows once; as an `IN (subquery)` Postgres
# may evaluate it more than once and promote more rows than the limit.
_PROMOTE_SQL = f"""
WITH picked AS MATERIALIZED (
  SELECT id FROM runs_run
  WHERE {_TOP_LIVE} AND status = '{RunStatus.WAITING_SLOT.value}'
  ORDER BY created_at, id LIMIT %s FOR UPDATE SKIP LOCKED
)
UPDATE runs_run r SET status = '{RunStatus.QUEUED.value}', updated_at = now() FROM picked WHERE r.id = picked.id
RETURNING r.id, r.step, r.last_seq
"""


def admission_lock_and_count() -> tuple[int, int]:
    """Inside a transaction: take the cluster's admission lock (held to commit,
    so this count and the caller's insert or promotion are one decision) and
    count the admitted and the waiting top-level runs."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [_ADMISSION_LOCK_KEY])
        cur.execute(_ADMISSION_COUNT_SQL)
        admitted, waiting = cur.fetchone() or (0, 0)
    return int(admitted), int(waiting)


def waiting_promote(count: int) -> list[tuple[str, int, int]]:
    """Under the admission lock: the `count` oldest waiting runs become `queued`; their (id, step, last_seq)."""
    with connection.cursor() as cur:
        cur.execute(_PROMOTE_SQL, [count])
        return [(str(r), int(s), int(q)) for r, s, q in cur.fetchall()]


def waiting_withdraw(run_id: str) -> bool:
    """Inside a transaction: delete the run if it still waits for its slot
    (under its row lock: a concurrent promotion skips it, or already flipped it)."""
    from apps.runs.models import Run

    waiting = Run.objects.select_for_update().filter(id=run_id, status=RunStatus.WAITING_SLOT).first()
    if waiting is None:
        return False
    waiting.delete()
    return True
