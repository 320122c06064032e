"""One step's work between claim and commit: the run's credentials opened, control drained, a
compaction when asked or due, the model call and the tool phase; the StepWrite to commit."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.conf import settings
from django.db import connection

from apps.gateway.providers import (
    ProviderCancelled,
    ProviderError,
)
from apps.gateway.resolver import Policy
from apps.runs import store
from apps.runs.compaction import plan as compacting
from apps.runs.credentials import CredentialsUnreadable, unseal
from apps.runs.engine import budget, turncancel
from apps.runs.engine.model import call_model, call_with_retries, record_reply, record_usage
from apps.runs.engine.tools import tool_phase
from apps.runs.engine.turncancel import CutKind, TurnCut, turn_cancelled
from apps.runs.engine.write import Next, StepWrite, cancelled_write, end_turn, failed_write, finish
from apps.runs.models import RunStatus
from apps.runs.prompt import messages_from_rows
from apps.runs.sessions.replay import replayed_history
from apps.runs.store import ClaimedRun

log = logging.getLogger("loomcycle.engine")


def open_credentials(run: ClaimedRun) -> StepWrite | None:
    """Open the run's sealed credentials into `run.credentials` (this
    iteration's memory only); a failed write when they do not open here."""
    try:
        run.credentials = unseal(run_id=run.id, sealed=run.credentials_sealed)
    except CredentialsUnreadable as exc:
        return failed_write(str(exc))
    return None


def execute(run: ClaimedRun, cancel: threading.Event) -> StepWrite:
    # A cancel signalled after the claim read the row: its flags are committed by now (turncancel.cut_at_claim).
    cut = turncancel.cut_at_claim(run, cancel.is_set())
    if cut.kind is CutKind.RUN:
        return cancelled_write(cut.reason)
    if run.runtime_state != "running":
        return StepWrite(status=RunStatus.PAUSED, next=Next.PARK, advance=False)
    max_attempts = settings.LOOMCYCLE.max_attempts
    if run.attempts > max_attempts:
        return failed_write(
            f"iteration {run.step} was started {run.attempts - 1} times without committing "
            f"(its worker was lost each time); giving up after {max_attempts} attempts"
        )
    write = StepWrite(status=RunStatus.RUNNING, next=Next.REQUEUE, usage=run.usage)
    if run.step >= run.max_iterations:  # resumed after sub-agents with no iteration left
        return finish(write, "max_iterations")
    rows = _load_rows(run, write)
    if (stopped := budget.gate(run, write)) is not None:  # over a hard budget (apps.core.spend)
        return stopped
    connection.close()  # hand the connection back to the pool before the provider call
    try:
        if _compact(run, rows, write, cancel):
            return _repark(run, write)
    except ProviderCancelled:  # the summary call was cut: nothing of it is kept
        return _model_cut(run, write, None)
    if cut.kind is CutKind.TURN:  # flagged before this turn's model call: its input is kept, nothing else ran
        return turn_cancelled(run, write, cut.reason)
    try:
        reply_text, calls, done = call_model(run, messages_from_rows(rows), cancel, write)
    except ProviderCancelled as exc:
        return _model_cut(run, write, exc)
    except ProviderError as exc:
        write.events.append({"type": "error", "error": str(exc)})
        write.status, write.next, write.error = RunStatus.FAILED, Next.FINISH, str(exc)
        write.stop_reason = exc.stop_reason
        return write
    record_reply(run, write, reply_text, calls, done)
    if calls:
        return tool_phase(run, calls, cancel, write, done)
    return end_turn(run, write, done.stop_reason)


def _model_cut(run: ClaimedRun, write: StepWrite, exc: ProviderCancelled | None) -> StepWrite:
    """A provider call was cut by the cancel event: the run ends, or this turn does
    (keeping what the model had streamed of its turn, `exc`; None for a compaction's
    summary call, of which nothing is kept), or, with neither flag set, the step is made again."""
    cut = turncancel.cut_now(run.id)
    if cut.kind is CutKind.RUN:
        return cancelled_write(cut.reason)
    if cut.kind is CutKind.NONE:
        return StepWrite(status=RunStatus.RUNNING, next=Next.REQUEUE, advance=False)
    if isinstance(exc, TurnCut):
        turncancel.keep_partial_reply(write, exc)
    return turn_cancelled(run, write, cut.reason)


def _load_rows(run: ClaimedRun, write: StepWrite) -> list[tuple[str, list[dict[str, Any]]]]:
    """The transcript with this step's drained inputs appended; a compaction request
    among them is noted in `write.compact` instead (apps.runs.compaction.plan)."""
    rows = list(run.transcript)
    if run.replays_session:  # POST /v1/sessions/{id}/messages: the session's earlier turns come first
        rows = replayed_history(tenant_id=run.tenant_id, session_id=run.session_id, turn=run.session_turn) + rows
    if run.pending_inputs:
        for input_id, text, source in store.pending_inputs(run_id=run.id):
            if compacting.is_request(source):
                write.consumed_inputs.append(input_id)
                write.compact.append(compacting.request_of(source, text))
                continue
            content = [{"type": "text", "text": text}]
            rows.append(("user", content))
            write.transcript.append(("user", content))
            write.consumed_inputs.append(input_id)
            segment = {"role": "user", "type": "trusted-text", "text": text}
            write.events.append({"type": "user_input", "segments": [segment], "source": source})
    return rows


def _compact(
    run: ClaimedRun, rows: list[tuple[str, list[dict[str, Any]]]], write: StepWrite, cancel: threading.Event
) -> bool:
    """Compact before the model call when asked or due (apps.runs.compaction.plan): the marker
    joins `rows` and the step's transcript. True when that was all this wake was for."""
    only = compacting.only_compacts(run, rows, write.compact)
    plan = compacting.plan(run, rows, write.compact)
    if isinstance(plan, compacting.Skipped):
        write.events.append(compacting.skipped_event(plan))
    elif plan is not None:
        retries = Policy(**(run.routing or {}).get("policy") or {}).retry_attempts
        try:
            summary, _, done = call_with_retries(run.provider, plan.request, cancel, write, retries)
        except ProviderError as exc:  # the history stays as it was; the model call goes on with it
            log.warning("run %s: compaction's summary call failed: %s", run.id, exc)
            write.events.append(compacting.failed_event(plan, exc))
            return only
        write.events.append({"type": "usage", "usage": done.usage.as_dict()})
        record_usage(run, write, done)
        marker, event = compacting.applied(run, plan, summary, marker_idx=len(rows))
        rows.append(marker)
        write.transcript.append(marker)
        write.events.append(event)
    return only


def _repark(run: ClaimedRun, write: StepWrite) -> StepWrite:
    """Back to awaiting_input after a compaction-only wake: no model turn, the step unchanged."""
    write.events.append({"type": "awaiting_input", "awaiting_input": {"since_turn": run.step}})
    write.status, write.next, write.advance = RunStatus.AWAITING_INPUT, Next.PARK, False
    return write
