"""Resident children (the Agent tool's ops open/send/poll/cancel/close, SPEC 4.8):
the reports to the parent, the closes, and beat's sweep. The tool's ops are
apps.runs.children.resident_tool; the rows' writes apps.runs.store.resident.

Invariants:
- A resident child is an interactive child run plus its `ResidentChild` row, both
  inserted in the parent's step commit that parks the parent on its `open` call
  (a lost fence leaves neither). Between turns the child is parked at
  `awaiting_input`; no worker and no request thread waits for anything.
- `open` and `send` park the parent's call (`waiting_children`), the row naming it
  (`waiter_call_id`). It is answered exactly once, by `resident_report`: under the
  parent's row lock and then the resident row's (the one lock order), a
  conditional clear of the waiting call in the transaction that appends the
  answer (apps.runs.wake.run_answer).
- A turn is over when the child is parked at `awaiting_input` with no input left,
  or its run ended, or its row was closed; a wait with `timeout_ms` is also
  answered once its deadline passed (the turn goes on: state `running`, and
  `poll` reads the rest).
- The parent reads each piece of the child's output once: `read_idx` (the child's
  transcript index read up to) moves forward only.
- Reports are made after the child's step commit (the engine), after the parent's
  park commit, and by beat's sweep, which also closes idle children, children of
  ended parents and rows of ended children: anything lost with a process is made
  up within a sweep period.
- A row leaves `open` exactly once (apps.runs.store.resident_close); closing an
  open row cancels the child's run (apps.runs.cancel.run_stop).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from django.db import DatabaseError, transaction
from django.utils import timezone

from apps.runs import selectors, store
from apps.runs.cancel import run_stop
from apps.runs.lifecycle import Ended
from apps.runs.models import TERMINAL, ResidentChild, RunStatus
from apps.runs.wake import run_answer

log = logging.getLogger("loomcycle.runs.resident")

TOOL = "Agent"
MAX_OUTPUT_CHARS = 32_768  # one answer's output: the newest text is kept when there is more
SWEEP_BATCH = 500


class State(StrEnum):
    """A resident child as its parent sees it."""

    IDLE = "idle"  # parked between turns: ready for a send
    RUNNING = "running"  # in a turn
    CLOSED = "closed"  # gone: `reason` says why


class Closed(StrEnum):
    """Why a row left `open` (the answer's `reason`; the child run's end adds its status)."""

    BY_PARENT = "closed by parent"
    IDLE_TTL = "idle ttl expired"
    PARENT_ENDED = "parent run ended"


@dataclass(frozen=True)
class Output:
    text: str
    next_idx: int
    truncated: bool


def state_of(row: ResidentChild, status: str, pending_inputs: int) -> State:
    """The child's state from its row and its run's status."""
    if not row.is_open or status in TERMINAL:
        return State.CLOSED
    if status == RunStatus.AWAITING_INPUT and pending_inputs == 0:
        return State.IDLE
    return State.RUNNING


def output_since(*, child_id: str, since: int) -> Output:
    texts, next_idx = selectors.resident_output(child_id=child_id, since=since)
    text = "\n".join(texts)
    truncated = len(text) > MAX_OUTPUT_CHARS
    return Output(text[-MAX_OUTPUT_CHARS:] if truncated else text, next_idx, truncated)


def answer_of(row: ResidentChild, state: State, out: Output, status: str, **extra: Any) -> dict[str, Any]:
    """The JSON an op answers with: the child, its state, its unread output."""
    body: dict[str, Any] = {"child_run_id": row.child_id, "agent": row.agent_name, "state": state.value}
    body["output"] = out.text
    if out.truncated:
        body["truncated"] = True
    if state == State.CLOSED:
        body["reason"] = row.close_reason or f"child run {status}"
        body["run_status"] = status
    return body | extra


def resident_report(*, child_id: str, now: datetime | None = None) -> bool:
    """Answer the parent's call waiting on `child_id` if the child's turn is over (or the
    wait timed out). False when there is nothing to answer (yet)."""
    parent_id = selectors.resident_parent_id(child_id=child_id)
    if parent_id is None:
        return False
    now = now or timezone.now()
    with transaction.atomic():
        row = store.resident_lock(child_id=child_id, parent_id=parent_id)
        if row is None or not row.waiter_call_id:
            return False
        status, pending = selectors.resident_child_run(child_id=child_id)
        state = state_of(row, status, pending)
        timed_out = row.waiter_until is not None and row.waiter_until <= now
        if state == State.RUNNING and not timed_out:
            return False
        if status in TERMINAL:
            store.resident_close(child_id=child_id, reason=f"child run {status}", now=now)
            row.close_reason = row.close_reason or f"child run {status}"
        out = output_since(child_id=child_id, since=row.read_idx)
        # Conditional: the waiting call is answered exactly once.
        if not store.resident_waiter_clear(
            child_id=child_id, call_id=row.waiter_call_id, read_idx=out.next_idx, now=now
        ):
            return False
        extra = {"timed_out": True} if state == State.RUNNING else {}
        text = json.dumps(answer_of(row, state, out, status, **extra))
        failed = status == RunStatus.FAILED
        run_answer(run_id=parent_id, call_id=row.waiter_call_id, tool_name=TOOL, text=text, is_error=failed)
    return True


def resident_refuse(*, parent_id: str, call_id: str, message: str) -> None:
    """Inside the parent's park commit: answer an open/send that the commit refuses (the cap
    counted under the parent's row lock, a full input queue), so the refusal commits with the
    park and cannot be lost with the process."""
    run_answer(run_id=parent_id, call_id=call_id, tool_name=TOOL, text=message, is_error=True)


def resident_turn_ended(*, child_id: str) -> None:
    """After a child's step commit parked it at `awaiting_input`: its idle time starts, and
    the parent's waiting call (if any) is answered. A failure is logged: the sweep reports."""
    try:
        if selectors.resident_parent_id(child_id=child_id) is None:
            return  # not a resident child
        store.resident_touch(child_id=child_id, now=timezone.now())
        resident_report(child_id=child_id)
    except DatabaseError:
        log.exception("resident child %s: its turn's report failed; beat's sweep makes it", child_id)


def resident_close(*, child_id: str, reason: str) -> bool:
    """Close an open row and cancel the child's run (and what it spawned). False when it was closed already."""
    with transaction.atomic():
        closed = store.resident_close(child_id=child_id, reason=reason, now=timezone.now())
    if closed:
        run_stop(run_id=child_id, reason=f"resident child: {reason}")
        resident_report(child_id=child_id)  # a call still waiting on it (a parallel send) gets its answer
    return closed


def on_run_ended(ended: Ended) -> None:
    """apps.runs.lifecycle subscriber (a child, or a run with the Agent tool): its resident rows."""
    resident_run_ended(run_id=ended.run_id)


def resident_run_ended(*, run_id: str) -> None:
    """After a run ended: if it was a resident child, its row closes and a call waiting on it
    is answered; if it opened resident children, they are closed. A failure is logged:
    beat's sweep closes what is left."""
    try:
        is_child, children = selectors.resident_touching(run_id=run_id)  # one query for most runs: neither
        if is_child:
            status, _ = selectors.resident_child_run(child_id=run_id)
            with transaction.atomic():
                store.resident_close(child_id=run_id, reason=f"child run {status}", now=timezone.now())
            resident_report(child_id=run_id)
        for child_id in children:
            resident_close(child_id=child_id, reason=Closed.PARENT_ENDED)
    except DatabaseError:
        log.exception("run %s ended; closing its resident rows failed, beat's sweep will", run_id)


def resident_close_if_idle(*, child_id: str, parent_id: str, now: datetime) -> bool:
    """Beat: close the child if it is still idle past its TTL at `now` (checked under the locks)."""
    with transaction.atomic():
        row = store.resident_lock(child_id=child_id, parent_id=parent_id, skip_locked=True)
        if row is None or not row.is_open or row.waiter_call_id:
            return False
        status, pending = selectors.resident_child_run(child_id=child_id)
        if state_of(row, status, pending) != State.IDLE:
            return False
        if (now - row.last_used_at).total_seconds() <= row.idle_ttl_seconds:
            return False
        closed = store.resident_close(child_id=child_id, reason=Closed.IDLE_TTL, now=now)
    if closed:
        run_stop(run_id=child_id, reason=f"resident child: {Closed.IDLE_TTL}")
    return closed


def resident_sweep(*, now: datetime | None = None) -> int:
    """Beat: close idle children past their TTL at `now` (default: this host's clock),
    close rows whose parent or child run ended, stop the runs of closed rows still live (a close
    whose stop was lost to a crash), and answer waiting calls whose turn is over or whose wait
    timed out. Safe to overlap: every change is conditional."""
    now = now or timezone.now()
    done = 0
    for child_id, parent_id in selectors.resident_idle_due(now=now, limit=SWEEP_BATCH):
        done += resident_close_if_idle(child_id=child_id, parent_id=parent_id, now=now)
    for child_id, parent_id in selectors.resident_ended_due(limit=SWEEP_BATCH):
        if selectors.run_status(run_id=parent_id) in TERMINAL:
            done += resident_close(child_id=child_id, reason=Closed.PARENT_ENDED)
        else:
            resident_run_ended(run_id=child_id)
            done += 1
    for child_id, reason in selectors.resident_closed_live(limit=SWEEP_BATCH):  # a close whose stop was lost
        done += run_stop(run_id=child_id, reason=f"resident child: {reason}")
    for child_id in selectors.resident_waiting_due(now=now, limit=SWEEP_BATCH):
        done += resident_report(child_id=child_id, now=now)
    if done:
        log.info("resident sweep: %d change(s)", done)
    return done
