"""Answering a parked tool call, and waking the run: the one service through
which sub-agents and channels resume a parked run (`run_answer`).

Invariants:
- Called inside the answerer's transaction, so the answer (transcript row,
  events, the finished tool-call record) and whatever produced it (a child's
  report flag, a channel cursor, the deleted wait row) commit together.
- The run row is locked first: answers to one run are serialised, so
  transcript indexes and event seqs stay consecutive.
- Exactly the answer that brings `pending_calls` to zero flips the run from
  its parked status back to `running` (a conditional UPDATE) and rings its
  doorbell after the commit. A run that ended meanwhile (cancelled) is left
  alone and the answer is dropped.

Runs waiting for an admission slot (`waiting_slot`, apps.runs.backpressure)
are woken here too, by `runs_admit_waiting`, when a top-level run ends and by
beat as a backstop.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.db import DatabaseError, connection, transaction

from apps.runs import backpressure
from apps.runs.dispatch import enqueue_iteration, notify_events, wake_and_enqueue
from apps.runs.models import TERMINAL, RunStatus

log = logging.getLogger("loomcycle.runs")

ANSWERABLE = (RunStatus.WAITING_CHILDREN, RunStatus.WAITING_CHANNEL)

# The run row locked first (answers to one run are serialised), with the call's
# started record in the same round trip.
_LOCK_SQL = """
SELECT r.status, r.step, r.last_seq, r.transcript_len, rec.id, rec.step, rec.input
FROM runs_run r
LEFT JOIN LATERAL (
  SELECT id, step, input FROM runs_toolcallrecord WHERE run_id = r.id AND call_id = %s ORDER BY step DESC LIMIT 1
) rec ON true
WHERE r.id = %s
FOR UPDATE OF r
"""

# Everything the answer writes, in one statement; returns whether this answer woke the run.
_ANSWER_SQL = """
WITH d AS (SELECT %(rows)s::jsonb AS j),
e AS (
  INSERT INTO runs_runevent (run_id, seq, step, type, payload, created_at)
  SELECT %(run_id)s, %(seq_base)s + x.n, %(step)s, x.v->>'type', x.v, now()
  FROM d, jsonb_array_elements(d.j->'e') WITH ORDINALITY AS x(v, n)
), t AS (
  INSERT INTO runs_transcriptentry (run_id, idx, step, role, content, created_at)
  SELECT %(run_id)s, %(idx)s, %(step)s, 'user', d.j->'t', now() FROM d
), c AS (
  UPDATE runs_toolcallrecord SET status = 'finished', is_error = %(is_error)s, finished_at = now()
  WHERE id = %(record_id)s
)
UPDATE runs_run SET
  last_seq = %(last_seq)s, transcript_len = transcript_len + 1, pending_calls = pending_calls - 1,
  status = CASE WHEN status = ANY(%(answerable)s) AND pending_calls = 1 THEN 'running' ELSE status END,
  updated_at = now()
WHERE id = %(run_id)s
RETURNING status = 'running' AND pending_calls = 0
"""


def run_answer(
    *,
    run_id: str,
    call_id: str,
    tool_name: str,
    text: str,
    is_error: bool,
    events: tuple[dict[str, Any], ...] = (),
) -> bool:
    """Append the result of parked call `call_id` (plus `events` before it) and
    wake the run if it was the last pending call. Must run inside a
    transaction. False when the run is already terminal (nothing written)."""
    with connection.cursor() as cur:
        cur.execute(_LOCK_SQL, [call_id, run_id])
        row = cur.fetchone()
        if row is None or row[0] in TERMINAL:
            return False
        _, run_step, last_seq, transcript_len, record_id, record_step, record_input = row
        step = record_step if record_id is not None else max(run_step - 1, 0)
        tool_use = {"id": call_id, "name": tool_name, "input": _json(record_input) if record_id is not None else {}}
        payloads = [*events, {"type": "tool_result", "tool_use": tool_use, "text": text, "is_error": is_error}]
        block = {"type": "tool_result", "tool_use_id": call_id, "content": text, "is_error": is_error}
        seq = last_seq + len(payloads)
        cur.execute(
            _ANSWER_SQL,
            {
                "rows": json.dumps({"e": payloads, "t": [block]}),
                "run_id": run_id,
                "seq_base": last_seq,
                "step": step,
                "idx": transcript_len,
                "is_error": is_error,
                "record_id": record_id,
                "last_seq": seq,
                "answerable": list(ANSWERABLE),
            },
        )
        woke = bool(cur.fetchone()[0])
    transaction.on_commit(lambda: notify_events(run_id, seq))
    # Exactly the last answer flips the run back to running (pending_calls was 1 under the row lock).
    if woke:
        transaction.on_commit(lambda: enqueue_iteration(run_id, run_step))
    return True


def _json(raw: Any) -> Any:
    return json.loads(raw) if isinstance(raw, str) else raw


def ring_promoted(promoted: list[backpressure.Promoted]) -> None:
    """After the promotion committed: each run's doorbell and its stream readers."""
    for p in promoted:
        wake_and_enqueue(p.run_id, p.last_seq, p.step)


def runs_admit_waiting() -> int:
    """Move waiting runs into free admission slots (oldest first) and ring
    their doorbells after that commit. Beat calls it too, as the backstop for a
    promotion lost with its process (or a cap raised or turned off)."""
    promoted = backpressure.promote_waiting()
    ring_promoted(promoted)
    if promoted:
        log.info("admission: %d waiting run(s) started", len(promoted))
    return len(promoted)


def run_slot_freed(run_id: str) -> None:
    """After a top-level run ended and committed: its admission slot is free.
    A no-op with `max_concurrent_runs` off (beat still promotes leftovers).
    A database error is logged: the run's end is committed, and beat's sweep
    promotes within a sweep period."""
    if backpressure.limits().max_concurrent_runs <= 0:
        return
    try:
        runs_admit_waiting()
    except DatabaseError:
        log.exception("run %s ended; promoting waiting runs failed, the admission sweep will", run_id)
