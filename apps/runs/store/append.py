"""The append primitive of apps/runs/store/: every event or transcript row of
a run is appended by `_advance`, `_bases` and `_append` together, inside the
ONE statement that updates (or inserts) the run row.

The run row's UPDATE moves its counters past the new rows (`_advance`), its
RETURNING gives the counters as they were before (`_bases`), and the writable
CTEs (`_append`) number the new rows from those bases. Worked example: a run
at last_seq=7 appends 3 events. The UPDATE sets last_seq = 7 + 3 = 10;
RETURNING sees the updated row and gives seq_base = 10 - 3 = 7; the events
get seqs seq_base + n for n = 1, 2, 3: 8, 9, 10. Transcript rows do the same
with transcript_len (idx_base + 0..). Each writer holds the run row's lock,
taken by its own UPDATE, from that UPDATE to its commit, so a concurrent
append waits and then reads last_seq=10: seqs stay consecutive, without
duplicates, whichever writers race. No run row returned (a lost fence or
compare-and-set) means nothing is appended.

Statuses in the SQL are built once from apps.runs.statuses (`_in`). The rows
are redacted where they are packed (`_redacted`), the one place every append
builds its rows: no event or transcript row reaches the table unredacted.
"""

from __future__ import annotations

import json
from typing import Any

from apps.core.redact import Redactor
from apps.runs.statuses import RunStatus


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


def _append(
    *,
    run: str,
    sources: str,
    rows: str,
    step: str,
    at: str = "now()",
    transcript: bool = True,
    version: str = "''",
) -> str:
    """3/3: writable CTEs `ev` (and `tx`) inserting the events `{rows}->'e'` at
    seq seq_base+1.. and the transcript rows `{rows}->'t'` ({role, content}) at
    idx idx_base+0.., where `run` is the CTE of the run row this statement
    updated or inserted (it returns id, seq_base, idx_base: `_bases`). No run
    row (a lost fence or compare-and-set) appends nothing. `version`: the SQL
    of the events' worker_version (an iteration's appends pass the worker's;
    others leave it '')."""
    ctes = f"""ev AS (
  INSERT INTO runs_runevent (run_id, seq, step, type, payload, created_at, worker_version)
  SELECT {run}.id, {run}.seq_base + x.n, {step}, x.v->>'type', x.v, {at}, {version}
  FROM {sources}, jsonb_array_elements({rows}->'e') WITH ORDINALITY AS x(v, n)
)"""
    if transcript:
        ctes += f""", tx AS (
  INSERT INTO runs_transcriptentry (run_id, idx, step, role, content, created_at)
  SELECT {run}.id, {run}.idx_base + x.n - 1, {step}, x.v->>'role', x.v->'content', {at}
  FROM {sources}, jsonb_array_elements({rows}->'t') WITH ORDINALITY AS x(v, n)
)"""
    return ctes


def _redacted(
    redactor: Redactor, events: list[dict[str, Any]], transcript: list[tuple[str, list[dict[str, Any]]]]
) -> dict[str, Any]:
    """The rows of an append as stored: events `e` and transcript rows `t`
    ({role, content}) with every string redacted (apps.core.redact). Every
    event and transcript row of a run is built here, so none is stored
    unredacted."""
    return {
        "e": redactor.value(events),
        "t": [{"role": role, "content": redactor.value(content)} for role, content in transcript],
    }


def _rows(
    events: list[dict[str, Any]], transcript: list[tuple[str, list[dict[str, Any]]]], *, redactor: Redactor
) -> dict[str, Any]:
    """The parameters of an append: its rows (one JSONB, redacted) and their counts."""
    packed = _redacted(redactor, events, transcript)
    return {"rows": json.dumps(packed), "n_e": len(events), "n_t": len(transcript)}


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value
