"""Interruptions (SPEC 6.7): resolving an Interruption.ask, and its expiry.

Invariants:
- An interrupt row exists iff its run parked on it (it is inserted in the parked
  step's commit, apps.runs.interrupts.tool) and leaves `pending` exactly once: every
  way out (an answer, a decline, the deadline, its run having ended) takes the
  row lock first, then the run's (through `apps.runs.wake.run_answer`), and moves
  the row with a conditional UPDATE in the same transaction that answers the
  parked call. Two racing resolvers: one 200, the other sees it resolved (409).
- The run is woken exactly once per interrupt: `run_answer` appends the call's
  result and flips the run back to `running` only for its last pending call.
- A resolve never answers a run that ended: the row is cancelled instead (409).
  One that comes after the deadline times the row out (the run gets its is_error
  result, as beat would give it) and is told 410.
- Expiry is beat's (`interrupts_expire_due`): rows past `expires_at`, and pending
  rows of runs that ended, claimed with SKIP LOCKED, so sweeps may overlap.
"""

from __future__ import annotations

import enum
import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from apps.core.errors import Conflict, Gone, NotFound, Unprocessable
from apps.core.timefmt import ts
from apps.runs import selectors, signals, store
from apps.runs.models import TERMINAL, Interrupt, InterruptStatus
from apps.runs.wake import run_answer

log = logging.getLogger("loomcycle.runs.interrupts")

TOOL = "Interruption"
DISPOSITIONS = ("answer", "declined")
EXPIRE_BATCH = 200


@dataclass(frozen=True)
class Resolve:
    """A human's reply: `disposition` answer (with `answer`) or declined (with an optional `note`)."""

    answer: Any
    disposition: str = "answer"
    resolved_by: str = "api"
    note: str = ""
    kind: str | None = None


class _Outcome(enum.Enum):
    RESOLVED = "resolved"
    EXPIRED = "expired"  # past its deadline: timed out now, the caller gets 410
    RUN_ENDED = "run_ended"  # its run had ended: cancelled now, the caller gets 409


# Resolver names the runtime writes itself: a caller may not claim them (the row, the run's tool
# result and `_system/interrupts/resolved` would attribute its answer to an operator or the runtime).
RESERVED_RESOLVERS = ("admin:", "_system")


def caller_resolve(*, answer: Any, disposition: str, resolved_by: str, note: str, kind: str | None) -> Resolve:
    """A reply from an API or MCP caller; 422 `reserved_resolver` for a name the runtime reserves."""
    if resolved_by.startswith(RESERVED_RESOLVERS):
        raise Unprocessable(
            f"resolved_by may not start with {' or '.join(RESERVED_RESOLVERS)} (the admin's and the runtime's)",
            code="reserved_resolver",
        )
    return Resolve(answer=answer, disposition=disposition, resolved_by=resolved_by, note=note, kind=kind)


def check_resolve(row: Interrupt, reply: Resolve) -> None:
    """422 for a reply that cannot answer this interrupt (nothing is written)."""
    if reply.kind is not None and reply.kind != row.kind:
        raise Unprocessable(f"kind {reply.kind!r} does not match the interrupt's {row.kind!r}", code="invalid_kind")
    if reply.disposition not in DISPOSITIONS:
        raise Unprocessable(
            f"disposition must be one of {', '.join(DISPOSITIONS)} (got {reply.disposition!r})",
            code="invalid_disposition",
        )
    if reply.disposition == "declined":
        if reply.answer not in (None, ""):
            raise Unprocessable("a decline carries no answer (put the reason in `note`)", code="decline_with_answer")
        return
    if reply.answer is None or reply.answer == "":
        raise Unprocessable("answer is required (or disposition: declined)", code="answer_required")
    if row.options and reply.answer not in row.options:
        raise Unprocessable(
            f"answer {reply.answer!r} is not one of the options {row.options}",
            code="answer_not_in_options",
            details={"options": row.options},
        )


def interrupt_resolve(
    *, tenant_id: str | None, owner: str | None, run_id: str, interrupt_id: str, reply: Resolve
) -> dict[str, Any]:
    """Answer or decline a pending interrupt of a run the caller may see (`tenant_id` None:
    any tenant; `owner`: an isolated member's own runs). 404 unknown (or another tenant's),
    409 not pending or its run ended, 410 expired, 422 a reply that does not fit."""
    with transaction.atomic():
        row = store.interrupt_lock(interrupt_id=interrupt_id, run_id=run_id)
        if row is None or (tenant_id is not None and row.tenant_id != tenant_id) or owner not in (None, row.user_id):
            raise NotFound(f"unknown interrupt {interrupt_id} of run {run_id}", code="not_found")
        _refuse_settled(row)
        if row.expires_at <= timezone.now():
            outcome, at = _time_out(row), None
        else:
            check_resolve(row, reply)
            outcome, at = _settle(row, reply)
    if outcome is _Outcome.EXPIRED:
        raise Gone(f"interrupt {interrupt_id} expired at {ts(row.expires_at)}", code="interrupt_expired")
    if outcome is _Outcome.RUN_ENDED:
        raise Conflict(f"run {run_id} has already ended; interrupt {interrupt_id} is cancelled", code="run_terminal")
    status = InterruptStatus.DECLINED if reply.disposition == "declined" else InterruptStatus.RESOLVED
    return {"interrupt_id": row.id, "status": status.value, "resolved_at": ts(at)}


def _refuse_settled(row: Interrupt) -> None:
    if row.status == InterruptStatus.TIMED_OUT:
        raise Gone(f"interrupt {row.id} expired at {ts(row.expires_at)}", code="interrupt_expired")
    if row.status != InterruptStatus.PENDING:
        raise Conflict(f"interrupt {row.id} is already {row.status}", code="interrupt_not_pending")


def _settle(row: Interrupt, reply: Resolve) -> tuple[_Outcome, datetime | None]:
    """Under the row lock: answer the parked call and move the row, together."""
    declined = reply.disposition == "declined"
    status = InterruptStatus.DECLINED if declined else InterruptStatus.RESOLVED
    at = timezone.now()
    result = (
        {"declined": True, "note": reply.note, "interrupt_id": row.id, "resolved_by": reply.resolved_by}
        if declined
        else {"interrupt_id": row.id, "answer": reply.answer, "resolved_at": ts(at), "resolved_by": reply.resolved_by}
    )
    if not _answer(row, result, is_error=False):
        return _Outcome.RUN_ENDED, None
    moved = store.interrupt_finish(
        interrupt_id=row.id,
        status=status,
        answer=None if declined else reply.answer,
        note=reply.note,
        resolved_by=reply.resolved_by,
        at=at,  # the resolved_at the agent was told
    )
    _announce(row, status, reply.resolved_by, moved)
    return _Outcome.RESOLVED, moved


def _answer(row: Interrupt, result: dict[str, Any], *, is_error: bool) -> bool:
    """The parked call's result, appended and the run woken if it was the last call; False (the row
    is cancelled instead) when the run has ended."""
    text = json.dumps(result, sort_keys=True)
    if run_answer(run_id=row.run_id, call_id=row.call_id, tool_name=TOOL, text=text, is_error=is_error):
        return True
    moved = store.interrupt_finish(interrupt_id=row.id, status=InterruptStatus.CANCELLED, resolved_by="_system")
    _announce(row, InterruptStatus.CANCELLED, "_system", moved)
    return False


def _time_out(row: Interrupt) -> _Outcome:
    """Under the row lock: the deadline passed; the call's is_error result, the row timed out."""
    result = {"interrupt_id": row.id, "status": "timed_out", "error": f"no answer by {ts(row.expires_at)}"}
    if not _answer(row, result, is_error=True):
        return _Outcome.RUN_ENDED
    moved = store.interrupt_finish(interrupt_id=row.id, status=InterruptStatus.TIMED_OUT, resolved_by="_system")
    _announce(row, InterruptStatus.TIMED_OUT, "_system", moved)
    return _Outcome.EXPIRED


def _announce(row: Interrupt, status: InterruptStatus, resolved_by: str, at: datetime | None) -> None:
    """`interruption_resolved` after the commit (its receivers bridge it to `_system/interrupts/resolved`)."""
    signals.send_on_commit(
        signals.interruption_resolved,
        run_id=row.run_id,
        tenant_id=row.tenant_id,
        user_id=row.user_id,
        agent=row.agent_name,
        interrupt_id=row.id,
        status=status.value,
        resolved_by=resolved_by,
        resolved_at=ts(at),
    )


def interrupt_expire(interrupt_id: str) -> bool:
    """Beat: time out one pending interrupt past its deadline (or cancel one whose run ended).
    False when another process holds it, or it is no longer due."""
    with transaction.atomic():
        row = store.interrupt_lock(interrupt_id=interrupt_id, skip_locked=True)
        if row is None or row.status != InterruptStatus.PENDING:
            return False
        if row.expires_at > timezone.now() and selectors.run_status(run_id=row.run_id) not in TERMINAL:
            return False
        _time_out(row)
    return True


def interrupts_expire_due(*, budget_s: float = 5.0) -> int:
    """Beat: expire what is due, in batches, for at most `budget_s`. Safe to overlap (SKIP LOCKED)."""
    started = timezone.now()
    expired = 0
    while (timezone.now() - started).total_seconds() < budget_s:
        due = selectors.interrupts_due(limit=EXPIRE_BATCH)
        progressed = 0
        for interrupt_id in due:
            try:
                done = interrupt_expire(interrupt_id)
            except DatabaseError:
                log.exception("interrupt %s could not be expired; retrying on the next tick", interrupt_id)
                connection.close()
                continue
            expired += done
            progressed += done
        if not progressed:  # nothing due, or everything due is being handled elsewhere
            break
    return expired
