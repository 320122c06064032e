"""The Agent tool's resident-child ops (SPEC 4.8, 6.4), a thin adapter over
apps.runs.children.resident (its invariants are there):

- `open {name, prompt, idle_ttl_seconds?, timeout_ms?}` starts an interactive child
  that inherits what a spawned child inherits (user, tenant, credentials, host
  policy, caller narrowing, volumes within the parent's; not tools) and PARKS the
  parent until the child's first turn ends: `{child_run_id, agent, state, output}`.
- `send {child_run_id, prompt, timeout_ms?}` gives the child its next user turn and
  parks the parent until that turn ends (or `timeout_ms` passes: `timed_out`, state
  `running`), answering with the output the parent had not read.
- `poll {child_run_id}` never parks: the state and the output not read yet.
- `cancel {child_run_id}` stops the child's current turn only (the turn-cancel of
  apps.runs.engine.turncancel: its partial output is kept, it re-parks idle and stays open);
  an idle child has nothing to cancel (`cancelled: false`).
- `close {child_run_id}` closes the child (idempotent).
A parent addresses only children it opened: any other id is `is_error`, whether it
exists or not. At most `LOOMCYCLE_RESIDENT_MAX_CHILDREN` are open per parent; the
count is checked again in the park's commit, under the parent's row lock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from apps.core.errors import ApplicationError
from apps.core.ids import is_ident
from apps.core.tools import Park, SpawnRequest, ToolContext, ToolRefusal, ToolResult, input_refusal
from apps.gateway import fairness
from apps.gateway.providers import ToolCall
from apps.runs import selectors, signals, store
from apps.runs.children.resident import (
    TOOL,
    Closed,
    Output,
    State,
    answer_of,
    output_since,
    resident_close,
    resident_refuse,
    resident_report,
    state_of,
)
from apps.runs.children.spawn import children_insert, spawn_prepare
from apps.runs.dispatch import enqueue_iteration
from apps.runs.live import publish_cancel
from apps.runs.models import TERMINAL, ResidentChild, RunStatus
from apps.runs.statuses import ANSWERABLE

OPS = ("open", "send", "poll", "cancel", "close")
TURN_CANCEL_REASON = "cancelled by parent"
FIELDS = {
    "open": frozenset({"op", "name", "prompt", "idle_ttl_seconds", "timeout_ms"}),
    "send": frozenset({"op", "child_run_id", "prompt", "timeout_ms"}),
    "poll": frozenset({"op", "child_run_id"}),
    "cancel": frozenset({"op", "child_run_id"}),
    "close": frozenset({"op", "child_run_id"}),
}
MAX_TIMEOUT_MS = 86_400_000  # a day
MAX_IDLE_TTL_SECONDS = 7 * 86_400


@dataclass
class _Parked:
    """What a parked open/send learnt in its park's commit, for its after-commit step."""

    child_id: str = ""
    woke_step: int | None = None


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ToolRefusal(f"{key} must be a non-empty string")
    return value


def _child_id(data: dict[str, Any]) -> str:
    value = data.get("child_run_id")
    if not isinstance(value, str) or not value or len(value) > 64:
        raise ToolRefusal("child_run_id must be the child_run_id that op=open returned")
    return value


def _positive(data: dict[str, Any], key: str, maximum: int) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= maximum:
        raise ToolRefusal(f"{key} must be an integer from 1 to {maximum}")
    return value


def _owned(ctx: ToolContext, child_id: str) -> ResidentChild:
    """The row of a child this run opened; anything else is refused alike (no probing)."""
    row = selectors.resident_of(parent_id=ctx.run_id, child_id=child_id)
    if row is None:
        raise ToolRefusal(f"not a resident child of this run: {child_id} (use a child_run_id that op=open returned)")
    return row


def _cap_message(cap: int) -> str:
    return f"resident child cap reached ({cap} open for this run); close one before opening another"


def _deadline(timeout_ms: int | None) -> datetime | None:
    return timezone.now() + timedelta(milliseconds=timeout_ms) if timeout_ms else None


def _open(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    name, prompt = data.get("name"), _text(data, "prompt")
    if not isinstance(name, str) or not is_ident(name):
        raise ToolRefusal("name must be an agent name ([A-Za-z0-9_-]{1,128})")
    ttl = (
        _positive(data, "idle_ttl_seconds", MAX_IDLE_TTL_SECONDS) or settings.LOOMCYCLE.resident_child_idle_ttl_seconds
    )
    timeout_ms = _positive(data, "timeout_ms", MAX_TIMEOUT_MS)
    cap = settings.LOOMCYCLE.resident_max_children
    if selectors.resident_open_count(parent_id=ctx.run_id) >= cap:
        raise ToolRefusal(_cap_message(cap))
    depth, user_tier = selectors.run_spawn_context(run_id=ctx.run_id)
    try:
        spawn = spawn_prepare(
            tenant_id=ctx.tenant_id,
            user_id=ctx.user_id,
            depth=depth,
            call=ToolCall(ctx.call_id, TOOL, dict(data)),
            request=SpawnRequest(agent=name, prompt=prompt),
            user_tier=user_tier,
            parent_id=ctx.run_id,
            credentials=ctx.credentials,
            interactive=True,
        )
    except ApplicationError as exc:
        raise ToolRefusal(f"cannot open {name!r}: {exc.message}") from exc
    parked = _Parked()
    record = partial(_record_open, parked, spawn, ctx, depth, ttl, timeout_ms)
    abandon = partial(fairness.run_slot_release, spawn.run_id)  # the child's slot (subruns.spawn_prepare)
    park = Park(
        status=RunStatus.WAITING_CHILDREN, record=record, after_commit=partial(_after_open, parked), abandon=abandon
    )
    return ToolResult("", park=park)


def _record_open(
    parked: _Parked,
    spawn: Any,
    ctx: ToolContext,
    depth: int,
    ttl: int,
    timeout_ms: int | None,
    run_id: str,
    _step: int,
    call_id: str,
) -> None:
    """Inside the parent's park commit (its run row locked): the cap, the child run, its row."""
    cap = settings.LOOMCYCLE.resident_max_children
    if selectors.resident_open_count(parent_id=run_id) >= cap:  # parallel opens of one step count each other here
        resident_refuse(parent_id=run_id, call_id=call_id, message=_cap_message(cap))
        fairness.run_slot_release(spawn.run_id)  # no child is inserted: its fairness slot goes back
        return
    (child_id,) = children_insert(
        parent_id=run_id, tenant_id=ctx.tenant_id, user_id=ctx.user_id, depth=depth, spawns=[spawn]
    )
    now = timezone.now()
    row = ResidentChild(
        child_id=child_id,
        parent_id=run_id,
        tenant_id=ctx.tenant_id,
        agent_name=spawn.request.agent,
        idle_ttl_seconds=ttl,
        waiter_call_id=call_id,
        waiter_until=_deadline(timeout_ms),
        opened_at=now,
        last_used_at=now,
    )
    store.resident_insert(row)
    signals.send_on_commit(
        signals.run_created, run_id=child_id, tenant_id=ctx.tenant_id, user_id=ctx.user_id, parent_id=run_id
    )
    parked.child_id = child_id


def _after_open(parked: _Parked, run_id: str, call_id: str) -> None:
    if parked.child_id:
        enqueue_iteration(parked.child_id, 0)


def _closed_answer(row: ResidentChild, status: str) -> ToolResult:
    out = Output("", row.read_idx, False)
    return ToolResult(json.dumps(answer_of(row, State.CLOSED, out, status)), is_error=True)


def _send(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    child_id, prompt = _child_id(data), _text(data, "prompt")
    timeout_ms = _positive(data, "timeout_ms", MAX_TIMEOUT_MS)
    row = _owned(ctx, child_id)
    status, pending = selectors.resident_child_run(child_id=child_id)
    if not row.is_open or status in TERMINAL:
        return _closed_answer(row, status)
    if pending >= settings.LOOMCYCLE.steer_queue_cap:
        raise ToolRefusal(f"the child's input queue is full ({pending} messages waiting)")
    parked = _Parked(child_id=child_id)
    record = partial(_record_send, parked, prompt, timeout_ms)
    park = Park(status=RunStatus.WAITING_CHILDREN, record=record, after_commit=partial(_after_send, parked))
    return ToolResult("", park=park)


WAITER_BUSY = "a call already waits on this child: send again after it is answered (or poll)"


def _record_send(parked: _Parked, prompt: str, timeout_ms: int | None, run_id: str, _step: int, call_id: str) -> None:
    """Inside the parent's park commit: the child's next user turn, and the call waiting for it."""
    child_id = parked.child_id
    row = store.resident_lock(child_id=child_id, parent_id=run_id)
    if row is None:  # checked before the park; rows go only with their parent
        resident_refuse(parent_id=run_id, call_id=call_id, message=f"not a resident child of this run: {child_id}")
        return
    if row.waiter_call_id:  # one waiting call per child: a second would overwrite the first, which never answers
        resident_refuse(parent_id=run_id, call_id=call_id, message=WAITER_BUSY)
        return
    status, _ = selectors.resident_child_run(child_id=child_id)
    if row.is_open and status not in TERMINAL:  # else the waiting call is answered `closed` after the commit
        queued = store.input_queue(run_id=child_id, text=prompt, cap=settings.LOOMCYCLE.steer_queue_cap)
        if not queued.accepted:
            resident_refuse(parent_id=run_id, call_id=call_id, message="the child's input queue is full")
            return
        if queued.woke:
            parked.woke_step = queued.step
            signals.send_on_commit(signals.run_resumed, run_id=child_id)
    until = _deadline(timeout_ms)
    if not store.resident_waiter_set(child_id=child_id, call_id=call_id, until=until, now=timezone.now()):
        resident_refuse(parent_id=run_id, call_id=call_id, message=WAITER_BUSY)  # unreachable under the lock


def _after_send(parked: _Parked, run_id: str, call_id: str) -> None:
    if parked.woke_step is not None:
        enqueue_iteration(parked.child_id, parked.woke_step)
    resident_report(child_id=parked.child_id)  # a child closed meanwhile: the call is answered now


def _poll(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    child_id = _child_id(data)
    _owned(ctx, child_id)
    return _read(ctx, child_id)


def _read(ctx: ToolContext, child_id: str, *, just_closed: bool = False, **extra: Any) -> ToolResult:
    """The child's state and the output the parent has not read, which is read now (under the
    parent's and the row's locks). `just_closed`: this call has closed the child."""
    with transaction.atomic():
        row = store.resident_lock(child_id=child_id, parent_id=ctx.run_id)
        if row is None:  # checked by the caller; rows go only with their parent
            raise ToolRefusal(f"not a resident child of this run: {child_id}")
        status, pending = selectors.resident_child_run(child_id=child_id)
        out = output_since(child_id=child_id, since=row.read_idx)
        store.resident_read(child_id=child_id, read_idx=out.next_idx)
    state = State.CLOSED if just_closed else state_of(row, status, pending)
    return ToolResult(json.dumps(answer_of(row, state, out, status, **extra)))


NOT_CUT = (
    "the child's turn is parked on its own wait (its sub-agents, a question or a channel) and is not cut; "
    "use close to stop the child"
)


def _cancel(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    child_id = _child_id(data)
    row = _owned(ctx, child_id)
    status, pending = selectors.resident_child_run(child_id=child_id)
    state = state_of(row, status, pending)
    if state == State.CLOSED:
        return _closed_answer(row, status)
    if state == State.IDLE:
        body = answer_of(row, state, Output("", row.read_idx, False), status, cancelled=False)
        return ToolResult(json.dumps(body))
    # A turn-cancel of the child (apps.runs.engine.turncancel): its worker keeps what the turn
    # produced, answers undispatched calls with errors and re-parks it idle; it stays open.
    flagged = store.turn_cancel_request(run_id=child_id, reason=TURN_CANCEL_REASON)
    if flagged:
        transaction.on_commit(partial(publish_cancel, [child_id]))
        return _read(ctx, child_id, cancelled=True)
    # Not runnable: the child parked meanwhile (idle now), or its turn is parked on its own wait,
    # which a turn-cancel does not cut: then the answer says to close it.
    status, _ = selectors.resident_child_run(child_id=child_id)
    if status in ANSWERABLE:
        return _read(ctx, child_id, cancelled=False, note=NOT_CUT)
    return _read(ctx, child_id, cancelled=False)


def _close(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    child_id = _child_id(data)
    _owned(ctx, child_id)
    resident_close(child_id=child_id, reason=Closed.BY_PARENT)  # idempotent: False when closed already
    return _read(ctx, child_id, just_closed=True, closed=True)


HANDLERS = {"open": _open, "send": _send, "poll": _poll, "cancel": _cancel, "close": _close}


def resident_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    """One resident op; refusals are is_error results the model reads."""
    op = data.get("op")
    refused = input_refusal(data, OPS, FIELDS.get(op if isinstance(op, str) else "", frozenset()))
    if refused is not None:
        return refused
    close_old_connections()
    try:
        return HANDLERS[str(op)](ctx, data)
    except ToolRefusal as exc:
        return ToolResult(str(exc), is_error=True)
    finally:
        connection.close()  # back to the pool: tools run on short-lived threads
