"""Turn-cancel of an interactive run (SPEC 4.7, `POST /v1/runs/{id}/cancel`).

The request stops the CURRENT model turn or tool batch only; the run is not
ended. It is a flag and a signal, never a thread that waits:
- the API sets `turn_cancel_requested` on a runnable interactive run
  (compare-and-set on its status: a run parked for input has no turn to stop,
  409 `not_mid_turn`) and, on commit, publishes the run on the same `lc:cancel`
  channel a whole-run cancel uses, so the worker holding the iteration sets
  its cancel event (the provider stream is cut, tools see `ctx.cancelled`);
- the iteration tells the two apart by reading both flags again
  (`cut_now`): a whole-run cancel always wins; a turn-cancel keeps the text
  the model had streamed so far and the tool_uses it had finished, keeps the
  results of tool calls that had finished, gives every other tool_use an
  `is_error` result "cancelled by operator", appends `turn_cancelled` and
  parks the run at `awaiting_input` as an ended turn does;
- the step commit that parks the run for input clears the flag (store.hot),
  so a turn that ended on its own while the request was in flight parks as
  usual and the flag never reaches the next turn. A flag still set when the
  iteration commits without parking (its tool batch had finished) stops the
  next iteration at its claim, before any model call.
A cancel event set with neither flag (a late signal meant for an earlier
iteration) stops nothing: the cut model call is made again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from django.db import transaction

from apps.core.errors import Conflict
from apps.core.types import Principal
from apps.gateway.providers import ProviderCancelled, ToolCall
from apps.runs import store
from apps.runs.credentials import run_redactor_of
from apps.runs.engine.write import end_turn
from apps.runs.live import publish_cancel
from apps.runs.models import RUNNABLE, TERMINAL
from apps.runs.selectors import run_cancel_flags, run_get

if TYPE_CHECKING:
    from apps.runs.engine.toolrun import CallOutcome
    from apps.runs.engine.write import StepWrite
    from apps.runs.store import ClaimedRun

DEFAULT_REASON = "cancelled by operator"
SYNTHETIC_RESULT = "cancelled by operator"  # SPEC 4.7: the result of a tool_use the cancel kept from running
STOP_REASON = "turn_cancelled"


def run_turn_cancel(*, principal: Principal, run_id: str, reason: str = "") -> dict[str, Any]:
    """Flag the current turn of an interactive run for cancel and signal its worker
    (on commit). 404 for a run the caller may not see, 409 `not_interactive`,
    409 `not_mid_turn` (parked, or ended). `parked` is False: the run parks when
    its worker commits the cancelled turn (`turn_cancelled`, then `awaiting_input`)."""
    run = run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    if not run.interactive:
        whole = f"/v1/agents/{run.agent_id}/cancel"
        raise Conflict(f"run {run.id} is not interactive; cancel the whole run with {whole}", code="not_interactive")
    reason = run_redactor_of(run_id=run.id, sealed=run.credentials_sealed).text(reason or DEFAULT_REASON)
    with transaction.atomic():
        flagged = store.turn_cancel_request(run_id=run.id, reason=reason)
        if flagged:
            transaction.on_commit(lambda: publish_cancel([run.id]))
    if not flagged:
        raise Conflict(_not_mid_turn(run.id), code="not_mid_turn")
    return {"run_id": run.id, "stopped": True, "parked": False, "reason": reason}


def _not_mid_turn(run_id: str) -> str:
    status = run_cancel_flags(run_id=run_id).status
    if status in TERMINAL:
        return f"run {run_id} has ended ({status}); there is no turn to cancel"
    return f"run {run_id} is parked ({status}), not in a turn; nothing to cancel"


class CutKind(Enum):
    """What a set cancel event means for the iteration that sees it."""

    NONE = "none"  # neither flag: a late signal; the iteration goes on
    RUN = "run"  # the whole run is cancelled (it always wins over a turn-cancel)
    TURN = "turn"  # this turn only: keep what was done, re-park at awaiting_input


@dataclass(frozen=True)
class Cut:
    kind: CutKind
    reason: str = ""


NO_CUT = Cut(CutKind.NONE)


class TurnCut(ProviderCancelled):
    """A provider stream cut by the cancel event, with what the model had streamed
    so far (raised by the engine's stream reader, so a turn-cancel keeps it)."""

    def __init__(self, text: str, calls: Sequence[ToolCall]) -> None:
        super().__init__("provider stream cut by a cancel")
        self.text = text
        self.calls = list(calls)


def cut_now(run_id: str) -> Cut:
    """The cut the run's flags ask for right now (read fresh: the signal may come
    after the claim read the row; the flags are committed before it is sent)."""
    flags = run_cancel_flags(run_id=run_id)
    if flags.cancel_requested:
        return Cut(CutKind.RUN, flags.cancel_reason)
    if flags.turn_cancel_requested and flags.status in RUNNABLE:
        return Cut(CutKind.TURN, flags.turn_cancel_reason or DEFAULT_REASON)
    return NO_CUT


def cut_at_claim(run: ClaimedRun, cancel_set: bool) -> Cut:
    """The cut at the top of an iteration: the claim's own flags, read fresh when
    only the signal (or the turn flag, whose reason the claim does not carry) says so."""
    if run.cancel_requested:
        return Cut(CutKind.RUN, run.cancel_reason)
    if cancel_set or run.turn_cancel_requested:
        return cut_now(run.id)
    return NO_CUT


def turn_cancelled_event(run: ClaimedRun, reason: str) -> dict[str, Any]:
    """SPEC 3's `turn_cancelled{reason,since_turn}`; `since_turn` is the iteration (step) stopped."""
    return {"type": "turn_cancelled", "turn_cancelled": {"reason": reason, "since_turn": run.step}}


def keep_partial_reply(write: StepWrite, cut: TurnCut) -> None:
    """The model's turn as far as it had streamed: its text and its finished
    tool_uses (an assistant turn), and an `is_error` result for each of those
    tool_uses, none of which ran. No usage: the provider never reported it."""
    content: list[dict[str, Any]] = []
    if cut.text:
        content.append({"type": "text", "text": cut.text})
        write.events.append({"type": "text", "text": cut.text})
    for call in cut.calls:
        block = {"id": call.id, "name": call.name, "input": call.input}
        content.append({"type": "tool_use", **block})
        write.events.append({"type": "tool_call", "tool_use": block})
    if content:
        write.transcript.append(("assistant", content))
    _results(write, cut.calls, {})


def keep_finished_calls(write: StepWrite, calls: list[ToolCall], ran: list[CallOutcome]) -> None:
    """A tool batch stopped by a turn-cancel: the calls that finished keep their
    results; a call that was never dispatched, or that asked to park or spawn
    (its wait or child is dropped with the turn), gets an `is_error` result."""
    write.spawns = []  # no child of a cancelled turn is started
    kept = {o.call.id: o for o in ran if o.result.park is None and o.result.spawn is None}
    _results(write, calls, kept)


def _results(write: StepWrite, calls: Sequence[ToolCall], kept: dict[str, CallOutcome]) -> None:
    """One tool_result per call, in tool_use order, as the transcript needs them."""
    for call in calls:
        outcome = kept.get(call.id)
        text, is_error = (outcome.result.text, outcome.result.is_error) if outcome else (SYNTHETIC_RESULT, True)
        if outcome is not None:
            write.events.extend(outcome.result.events)
        block = {"id": call.id, "name": call.name, "input": call.input}
        write.events.append({"type": "tool_result", "tool_use": block, "text": text, "is_error": is_error})
        write.finished_calls.append((call.id, is_error))
        result = {"type": "tool_result", "tool_use_id": call.id, "content": text, "is_error": is_error}
        write.transcript.append(("user", [result]))


def turn_cancelled(run: ClaimedRun, write: StepWrite, reason: str) -> StepWrite:
    """SPEC 4.7: the turn ends here; the run parks for input as an ended turn does."""
    write.events.append(turn_cancelled_event(run, reason))
    return end_turn(run, write, STOP_REASON)
