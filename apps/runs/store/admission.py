"""Admission (backpressure) writes (part of apps/runs/store/, the one package
that writes the runs app's tables): the cluster-wide admission lock and
count, the promotion of waiting runs and a waiting run's withdrawal.
"""

from __future__ import annotations

from django.db import connection

from apps.runs.models import Run
from apps.runs.statuses import TERMINAL, RunStatus
from apps.runs.store.append import _in

# One lock for every admission decision of the cluster (pg_advisory_xact_lock key).
_ADMISSION_LOCK_KEY = 0x6C635F61646D6974  # "lc_admit"

_TOP_LIVE = f"parent_id IS NULL AND NOT (status IN ({_in(TERMINAL)}))"  # the partial index run_top_live

# A run enqueued behind its session (`waiting_session`) is not admitted yet: its session's
# promotion (apps.runs.sessions.promotion) sends it here as `waiting_slot` when admission is on.
_ADMISSION_COUNT_SQL = f"""
SELECT count(*) FILTER (WHERE status NOT IN ({_in((RunStatus.WAITING_SLOT, RunStatus.WAITING_SESSION))})),
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


def waiting_withdraw(run_id: str) -> str | None:
    """Inside a transaction: delete the run if it still waits for its slot
    (under its row lock: a concurrent promotion skips it, or already flipped it);
    the deleted run's session id (a run enqueued behind it there must be
    promoted), None when nothing was deleted."""
    waiting = Run.objects.select_for_update().filter(id=run_id, status=RunStatus.WAITING_SLOT).first()
    if waiting is None:
        return None
    session_id = waiting.session_id
    waiting.delete()
    return session_id
