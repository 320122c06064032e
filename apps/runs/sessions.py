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
- An enqueued run is promoted by the end of the session's live run (the
  after-commit hook `session_next`, called wherever a top-level run's slot is
  freed: the engine's finish, a cancel) and by the lease sweep as a backstop
  (`sessions_promote_sweep`). Promotion is a conditional UPDATE under the
  lock, so it happens once, and it skips a run flagged for cancel. A run
  enqueued also tries a promotion after its own commit (the live run it
  queued behind may have ended before that commit, finding no waiting row).
- A run that replays its session sees the transcript rows of the session's
  earlier turns (not rolled back) before its own: they are read at each of its
  iterations, never copied (no history that grows with the square of the turns).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from django.db import DatabaseError, transaction

from apps.core.errors import Conflict, NotFound, Unprocessable
from apps.runs import backpressure, store
from apps.runs.dispatch import wake_and_enqueue
from apps.runs.session_selectors import Rows, session_history, session_runs, session_waiting_of, sessions_stalled
from apps.runs.statuses import TERMINAL, RunStatus

log = logging.getLogger("loomcycle.runs")


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


def session_promote(session_id: str) -> bool:
    """Move the session's oldest enqueued run on if none of its runs is live: to
    `queued` (doorbell after the commit), or to `waiting_slot` when admission is on
    (the admission promotion that follows a run's end starts it)."""
    gated = backpressure.limits().max_concurrent_runs > 0
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


def sessions_promote_sweep() -> int:
    """Beat (the lease sweep): start enqueued runs whose session has nothing in flight."""
    started = sum(session_promote(session_id) for session_id in sessions_stalled())
    if started:
        log.info("sessions: %d enqueued run(s) started by the sweep", started)
    return started


def replayed_history(*, tenant_id: str, session_id: str, turn: int | None) -> Rows:
    """What a replaying run's model sees before its own rows: its session's turns
    before `turn` (all when None), each tool call answered (history_repaired)."""
    return history_repaired(session_history(tenant_id=tenant_id, session_id=session_id, before_turn=turn))


NO_RESULT = "no result: the run ended before this tool call was answered"


def history_repaired(rows: Rows) -> Rows:
    """The rows with an error `tool_result` after every assistant row whose tool_use
    is not answered before the next assistant row (a turn interrupted mid-call), so a
    replayed history never separates a tool_use from a result (the provider APIs
    refuse that). Linear: one backward pass collects, for each assistant row, the
    ids answered by the user rows up to the next assistant row; one forward pass
    writes."""
    answered_after: dict[int, set[str]] = {}
    following: set[str] = set()
    for i in range(len(rows) - 1, -1, -1):
        role, content = rows[i]
        if role == "assistant":
            answered_after[i], following = following, set()
        else:
            following.update(str(b.get("tool_use_id")) for b in content if b.get("type") == "tool_result")
    out: Rows = []
    for i, (role, content) in enumerate(rows):
        out.append((role, content))
        if role != "assistant":
            continue
        missing = [u for u in _tool_use_ids(content) if u not in answered_after[i]]
        if missing:
            out.append(("user", [_no_result(u) for u in missing]))
    return out


def _tool_use_ids(content: list[dict[str, Any]]) -> list[str]:
    return [str(b.get("id")) for b in content if b.get("type") == "tool_use"]


def _no_result(tool_use_id: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": NO_RESULT, "is_error": True}
