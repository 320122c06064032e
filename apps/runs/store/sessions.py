"""Session writes (part of apps/runs/store/, the one package that writes the
runs app's tables): the per-session decision lock, the promotion of a run
enqueued behind its session, the `rollback` mark, and a replay's seed run
made terminal, and the cancel flags an interrupt sets with its insert.

The hard invariant, one in-flight run per session, is the partial unique
index `run_session_live` (apps.runs.models): whatever races, Postgres refuses a
second live top-level run of a session. The lock below only serialises the
decisions taken around it (busy or not, enqueue order, promotion), so they
never meet that index as an IntegrityError.
"""

from __future__ import annotations

from django.db import connection

from apps.runs.statuses import SESSION_IDLE, TERMINAL, RunStatus
from apps.runs.store.append import _in

# Transaction-scoped: released by the commit or rollback of the deciding transaction,
# so no lock outlives a request or a worker (no session-lock GC, unlike loomcycle's).
_SESSION_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended('lc_session:' || %s, 0))"

# The oldest enqueued run of a session, only while none of its runs is in flight.
# No SKIP LOCKED: a waiting row locked by its cancel is waited for and re-checked
# (it no longer matches once cancelled); that cancel's own end promotes the next.
_PROMOTE_SQL = f"""
WITH picked AS MATERIALIZED (
  SELECT w.id FROM runs_run w
  WHERE w.session_id = %(session)s AND w.parent_id IS NULL AND w.status = '{RunStatus.WAITING_SESSION.value}'
    AND NOT w.cancel_requested
    AND NOT EXISTS (
      SELECT 1 FROM runs_run l
      WHERE l.session_id = w.session_id AND l.parent_id IS NULL AND l.status NOT IN ({_in(SESSION_IDLE)})
    )
  ORDER BY w.session_turn, w.id LIMIT 1 FOR UPDATE
)
UPDATE runs_run r SET status = %(status)s, updated_at = now() FROM picked WHERE r.id = picked.id
RETURNING r.id, r.step, r.last_seq
"""


def session_lock(session_id: str) -> None:
    """Inside a transaction: take the session's decision lock (held to commit)."""
    with connection.cursor() as cur:
        cur.execute(_SESSION_LOCK_SQL, [session_id])


def session_promote(*, session_id: str, status: str) -> tuple[str, int, int] | None:
    """Under `session_lock`: the session's oldest enqueued run moves to `status`
    (`queued`, or `waiting_slot` when admission is on) if no run of the session is
    in flight; its (id, step, last_seq), None when nothing moved."""
    with connection.cursor() as cur:
        cur.execute(_PROMOTE_SQL, {"session": session_id, "status": status})
        row = cur.fetchone()
    return None if row is None else (str(row[0]), int(row[1]), int(row[2]))


def session_rollback_mark(*, run_ids: list[str]) -> None:
    """Drop these runs' turns from their session's replayed history (`rollback`).
    Their rows stay: transcripts are append-only; continuation skips them."""
    with connection.cursor() as cur:
        cur.execute("UPDATE runs_run SET session_rolled_back = true WHERE id = ANY(%s)", [run_ids])


def session_cancel_mark(*, run_ids: list[str], reason: str) -> None:
    """Inside the transaction that inserts an interrupting run: flag the runs it
    displaces for cancel (those still live), so they end even if the after-commit
    cancel is lost (the claim's cancel check; services.run_parked_cancels_finish)."""
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE runs_run SET cancel_requested = true, cancel_reason = %s"
            f" WHERE id = ANY(%s) AND status NOT IN ({_in(TERMINAL)})",
            [reason, run_ids],
        )


def seed_finish(*, run_id: str) -> None:
    """A replay's seed run (inserted `completed`, never claimed) gets its end: the
    stop reason, its start and end times, no credentials."""
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE runs_run SET stop_reason = 'session_replay', started_at = created_at, completed_at = now(),"
            " credentials_sealed = '' WHERE id = %s",
            [run_id],
        )
