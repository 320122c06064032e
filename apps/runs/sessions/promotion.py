"""Sessions (SPEC 2.3, 4.5): a run joins an existing session, at most one run
of a session is in flight cluster-wide, and a double-text follows its
request's `multitask_strategy` (LangGraph's server's four):

- `reject` (default): 409 `session_busy` while a run of the session is live;
- `enqueue`: the new run is inserted `waiting_session` (a parked row, no
  worker, no doorbell) and starts when the session's live run ends;
- `interrupt`: every live run of the session is cancelled (what it wrote stays
  in the session's history) and the new run is enqueued behind their ends. The
  cancel flags commit with the new run (so the claim's cancel check and the
  parked-cancel sweep finish them even if the process dies right after the
  commit); the after-commit hook finishes and announces them at once;
- `rollback`: as `interrupt`, and the cancelled runs' turns are dropped from
  the history later runs replay (`session_rolled_back`; their rows stay).

Invariants:
- One in-flight run per session is Postgres's partial unique index
  `run_session_live` (top-level runs not terminal and not `waiting_session`).
- Every decision about a session (busy, enqueue order, turn number,
  promotion) runs under its transaction advisory lock (store.session_lock),
  in the transaction that inserts or moves the run.
- An enqueued run is promoted by the end of the session's live run (`session_next`,
  subscribed to every top-level run's end: apps.runs.lifecycle, called by the
  engine's finish and by a cancel) and by the lease sweep as a backstop
  (`sessions_promote_sweep`). Promotion is a conditional UPDATE under the
  lock, so it happens once, and it skips a run flagged for cancel. A run
  enqueued also tries a promotion after its own commit (the live run it
  queued behind may have ended before that commit, finding no waiting row).
  Placement and promotion are the floor's (apps.runs.backpressure: a run's creation
  and a withdrawn waiting run move the queue too); this module answers a run's end.
- A run that replays its session sees the transcript rows of the session's
  earlier turns (not rolled back) before its own: they are read at each of its
  iterations, never copied (no history that grows with the square of the turns).
"""

from __future__ import annotations

import logging

from django.db import DatabaseError

from apps.runs.backpressure import session_promote
from apps.runs.lifecycle import Ended
from apps.runs.sessions.selectors import session_waiting_of, sessions_stalled

log = logging.getLogger("loomcycle.runs")


def on_run_ended(ended: Ended) -> None:
    """apps.runs.lifecycle subscriber (top-level runs): the session's next run starts."""
    session_next(ended.run_id)


def session_next(run_id: str) -> None:
    """After top-level run `run_id` ended and committed: start the next run enqueued in
    its session, if any (one query when none). A database error is logged: the end is
    committed, and the lease sweep promotes it (sessions_promote_sweep)."""
    try:
        session_id = session_waiting_of(run_id=run_id)
        if session_id is not None:
            session_promote(session_id)
    except DatabaseError:
        log.exception("run %s ended; starting its session's next run failed, the lease sweep will", run_id)


def sessions_promote_sweep() -> int:
    """Beat (the lease sweep): start enqueued runs whose session has nothing in flight."""
    started = sum(session_promote(session_id) for session_id in sessions_stalled())
    if started:
        log.info("sessions: %d enqueued run(s) started by the sweep", started)
    return started
