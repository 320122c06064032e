"""One agent-loop iteration: claim -> model call -> tools -> one fenced commit.

Invariants:
- A delivery does work only if it wins the claim: `step` matches, the run is
  runnable and no live lease exists (compare-and-set, zero rows = someone
  else won or the doorbell is stale).
- No transaction or DB connection is held across the provider or tool calls.
- Everything the iteration produced (transcript rows, events with
  consecutive seq, usage, step+1, next status) commits in ONE transaction
  whose UPDATE is fenced on (step, lease_token); a lost fence discards it.
- Doorbells and stream notifications go out only after that commit.
Commits per iteration: the claim, the tool-call start records (only when the
model called tools) and the step commit.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from apps.core.tools import ToolContext
from apps.gateway.providers import (
    Done,
    ProviderCancelled,
    ProviderError,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolSpec,
    get_provider,
)
from apps.runs import registry
from apps.runs.dispatch import enqueue_iteration, notify_events
from apps.runs.live import LIVE, WORKER_ID
from apps.runs.models import Run, RunEvent, RunInput, RunStatus, ToolCallRecord, ToolCallStatus, TranscriptEntry
from apps.runs.prompt import messages_from_rows
from apps.runs.toolrun import run_calls

log = logging.getLogger("loomcycle.engine")

PROVIDER_RETRIES = 3

_CLAIM_SQL = """
UPDATE runs_run SET
  status = CASE WHEN status = 'queued' THEN 'running' ELSE status END,
  started_at = COALESCE(started_at, now()),
  attempts = attempts + 1,
  lease_owner = %s,
  lease_until = now() + make_interval(secs => %s),
  lease_token = lease_token + 1,
  last_heartbeat_at = now(),
  updated_at = now()
WHERE id = %s AND step = %s AND status IN ('queued', 'running')
  AND (lease_until IS NULL OR lease_until < now())
RETURNING *, COALESCE((SELECT state FROM runs_runtimestate WHERE id = 1), 'running') AS runtime_state
"""


@dataclass
class StepWrite:
    """What one iteration commits. `next` is requeue | park | finish."""

    status: str
    next: str
    events: list[dict[str, Any]] = field(default_factory=list)
    transcript: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    stop_reason: str = ""
    error: str = ""
    consumed_inputs: list[int] = field(default_factory=list)
    finished_calls: list[tuple[str, bool]] = field(default_factory=list)
    advance: bool = True  # False for a pause park: no provider call was made


def run_iterate(*, run_id: str, step: int) -> str:
    """Execute iteration `step` of `run_id` if this delivery wins the claim."""
    with LIVE.track(run_id) as cancel:
        run = _claim(run_id, step)
        if run is None:
            return "noop"
        LIVE.set_token(run_id, run.lease_token)
        write = _execute(run, cancel)
        committed = _commit(run, write)
    if not committed:
        log.warning("run %s step %s: lease fence lost, iteration discarded", run_id, step)
        return "fence_lost"
    _after_commit(run, write)
    return write.next


def _claim(run_id: str, step: int) -> Run | None:
    lease = settings.LOOMCYCLE.lease_seconds
    # Compare-and-set: zero rows means a duplicate/stale doorbell or a live lease elsewhere.
    rows = list(Run.objects.raw(_CLAIM_SQL, [WORKER_ID, lease, run_id, step]))
    return rows[0] if rows else None


def _execute(run: Run, cancel: threading.Event) -> StepWrite:
    if run.cancel_requested or cancel.is_set():
        return cancelled_write(run.cancel_reason)
    if getattr(run, "runtime_state", "running") != "running":
        return StepWrite(status=RunStatus.PAUSED, next="park", advance=False)
    max_attempts = settings.LOOMCYCLE.max_attempts
    if run.attempts > max_attempts:
        return failed_write(
            f"iteration {run.step} was started {run.attempts - 1} times without committing "
            f"(its worker was lost each time); giving up after {max_attempts} attempts"
        )
    write = StepWrite(status=RunStatus.RUNNING, next="requeue")
    if run.step == 0:
        write.events.append({"type": "started"})
    messages = _load_messages(run, write)
    connection.close()  # hand the connection back to the pool before the provider call
    try:
        reply_text, calls, done = _call_model(run, messages, cancel, write)
    except ProviderCancelled:
        return cancelled_write(_cancel_reason(run))
    except ProviderError as exc:
        write.events.append({"type": "error", "error": str(exc)})
        write.status, write.next, write.error = RunStatus.FAILED, "finish", str(exc)
        return write
    _record_reply(run, write, reply_text, calls, done)
    if calls:
        return _run_tools(run, calls, cancel, write, done)
    return _end_turn(run, write, done.stop_reason)


def _cancel_reason(run: Run) -> str:
    fresh = Run.objects.filter(id=run.id).values_list("cancel_reason", flat=True).first()
    connection.close()
    return fresh or ""


def _load_messages(run: Run, write: StepWrite) -> list[dict[str, Any]]:
    rows = [(r.role, r.content) for r in TranscriptEntry.objects.filter(run_id=run.id).order_by("idx")]
    if run.pending_inputs:
        for inp in RunInput.objects.filter(run_id=run.id, consumed_step__isnull=True).order_by("id"):
            content = [{"type": "text", "text": inp.text}]
            rows.append(("user", content))
            write.transcript.append(("user", content))
            write.consumed_inputs.append(inp.id)
            write.events.append(
                {
                    "type": "user_input",
                    "segments": [{"role": "user", "type": "trusted-text", "text": inp.text}],
                    "source": inp.source,
                }
            )
    return messages_from_rows(rows)


def _call_model(
    run: Run, messages: list[dict[str, Any]], cancel: threading.Event, write: StepWrite
) -> tuple[str, list[ToolCall], Done]:
    provider = get_provider(run.provider)
    tools = [ToolSpec(t.name, t.description, t.input_schema) for n in run.tools if (t := registry.get(n))]
    request = ProviderRequest(
        model=run.model, system=list(run.system), messages=messages, tools=tools, max_tokens=run.max_tokens
    )
    for attempt in range(1, PROVIDER_RETRIES + 2):
        try:
            return _consume(provider.stream(request, cancel))
        except ProviderError as exc:
            if not exc.retryable or attempt > PROVIDER_RETRIES:
                raise
            wait_s = exc.retry_after if exc.retry_after is not None else 0.5 * 2 ** (attempt - 1)
            wait_s = min(wait_s, 30.0) + random.uniform(0, 0.1)
            write.events.append(
                {
                    "type": "retry",
                    "retry": {
                        "provider": provider.id,
                        "attempt": attempt,
                        "wait_ms": int(wait_s * 1000),
                        "reason": "retry-after header" if exc.retry_after is not None else "exponential backoff",
                        "error": str(exc),
                    },
                }
            )
            if cancel.wait(wait_s):
                raise ProviderCancelled() from exc
    raise AssertionError("unreachable: the loop returns or raises")


def _consume(stream: Any) -> tuple[str, list[ToolCall], Done]:
    text: list[str] = []
    calls: list[ToolCall] = []
    done: Done | None = None
    for event in stream:
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, ToolCall):
            calls.append(event)
        elif isinstance(event, Done):
            done = event
        elif isinstance(event, ThinkingDelta):
            continue  # reasoning is not replayed into history by this build
    if done is None:
        raise ProviderError("engine", 502, "provider stream ended without a done event")
    return "".join(text), calls, done


def _record_reply(run: Run, write: StepWrite, text: str, calls: list[ToolCall], done: Done) -> None:
    content: list[dict[str, Any]] = []
    if text:
        content.append({"type": "text", "text": text})
        write.events.append({"type": "text", "text": text})
    for call in calls:
        block = {"id": call.id, "name": call.name, "input": call.input}
        content.append({"type": "tool_use", **block})
        write.events.append({"type": "tool_call", "tool_use": block})
    if content:
        write.transcript.append(("assistant", content))
    usage = done.usage.as_dict()
    write.events.append({"type": "usage", "usage": usage})
    write.usage = _add_usage(run.usage or {}, usage)


def _add_usage(total: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    out = dict(total)
    for key, value in usage.items():
        out[key] = out.get(key, 0) + value if isinstance(value, int) else value
    return out


def _run_tools(run: Run, calls: list[ToolCall], cancel: threading.Event, write: StepWrite, done: Done) -> StepWrite:
    _record_tool_starts(run, calls)
    base = ToolContext(
        run_id=run.id,
        agent_id=run.agent_id,
        session_id=run.session_id,
        tenant_id=run.tenant_id,
        user_id=run.user_id,
        agent_name=run.agent_name,
        agent_def_id=run.agent_def_id,
        agent_def_sha256=run.agent_def_sha256,
        provider=run.provider,
        model=run.model,
        step=run.step,
        call_id="",
        tools=tuple(run.tools),
        cancelled=cancel,
    )
    outcomes = run_calls(base, calls)
    if cancel.is_set():
        return cancelled_write(_cancel_reason(run))
    by_id = {o.call.id: o.result for o in outcomes}
    for o in outcomes:  # events in completion order
        block = {"id": o.call.id, "name": o.call.name, "input": o.call.input}
        write.events.append(
            {"type": "tool_result", "tool_use": block, "text": o.result.text, "is_error": o.result.is_error}
        )
        write.finished_calls.append((o.call.id, o.result.is_error))
    for call in calls:  # transcript in tool_call order
        result = by_id[call.id]
        write.transcript.append(
            (
                "user",
                [{"type": "tool_result", "tool_use_id": call.id, "content": result.text, "is_error": result.is_error}],
            )
        )
    if run.step + 1 >= run.max_iterations:
        return _finish(write, "max_iterations")
    return write


def _record_tool_starts(run: Run, calls: list[ToolCall]) -> None:
    """Recorded before the tools run; a redelivery repeats the same keys."""
    ToolCallRecord.objects.bulk_create(
        [ToolCallRecord(run_id=run.id, step=run.step, call_id=c.id, name=c.name, input=c.input) for c in calls],
        ignore_conflicts=True,
    )
    connection.close()


def _end_turn(run: Run, write: StepWrite, stop_reason: str) -> StepWrite:
    if run.interactive:
        write.events.append({"type": "awaiting_input", "awaiting_input": {"since_turn": run.step + 1}})
        write.status, write.next, write.stop_reason = RunStatus.AWAITING_INPUT, "park", stop_reason
        return write
    return _finish(write, stop_reason or "end_turn")


def _finish(write: StepWrite, stop_reason: str) -> StepWrite:
    write.status, write.next, write.stop_reason = RunStatus.COMPLETED, "finish", stop_reason
    write.events.append({"type": "done", "stop_reason": stop_reason, "usage": write.usage or {}})
    return write


def cancelled_write(reason: str) -> StepWrite:
    reason = reason or "cancelled by api"
    return StepWrite(
        status=RunStatus.CANCELLED,
        next="finish",
        stop_reason=reason,
        events=[{"type": "done", "stop_reason": reason, "cancelled": True}],
    )


def failed_write(error: str) -> StepWrite:
    return StepWrite(status=RunStatus.FAILED, next="finish", error=error, events=[{"type": "error", "error": error}])


def _commit(run: Run, write: StepWrite) -> bool:
    now = timezone.now()
    fields: dict[str, Any] = {
        "status": write.status,
        "attempts": 0,
        "lease_owner": "",
        "lease_until": None,
        "last_seq": run.last_seq + len(write.events),
        "transcript_len": run.transcript_len + len(write.transcript),
        "updated_at": now,
        "last_heartbeat_at": now,
        "pending_inputs": F("pending_inputs") - len(write.consumed_inputs),
    }
    if write.advance:
        fields["step"] = run.step + 1
    if write.usage is not None:
        fields["usage"] = write.usage
    if write.next == "finish":
        fields.update(stop_reason=write.stop_reason, error=write.error, completed_at=now)
    elif write.stop_reason:
        fields["stop_reason"] = write.stop_reason
    with transaction.atomic():
        # Fenced: only the holder of this step's lease may commit it.
        if not Run.objects.filter(id=run.id, step=run.step, lease_token=run.lease_token).update(**fields):
            return False
        _write_rows(run, write)
    connection.close()
    return True


def _write_rows(run: Run, write: StepWrite) -> None:
    step = run.step
    TranscriptEntry.objects.bulk_create(
        [
            TranscriptEntry(run_id=run.id, idx=run.transcript_len + i, step=step, role=role, content=content)
            for i, (role, content) in enumerate(write.transcript)
        ]
    )
    RunEvent.objects.bulk_create(
        [
            RunEvent(run_id=run.id, seq=run.last_seq + i + 1, step=step, type=e["type"], payload=e)
            for i, e in enumerate(write.events)
        ]
    )
    if write.consumed_inputs:
        RunInput.objects.filter(id__in=write.consumed_inputs).update(consumed_step=step)
    for is_error in (False, True):
        ids = [cid for cid, err in write.finished_calls if err is is_error]
        if ids:
            ToolCallRecord.objects.filter(run_id=run.id, step=step, call_id__in=ids).update(
                status=ToolCallStatus.FINISHED, is_error=is_error, finished_at=timezone.now()
            )


def _after_commit(run: Run, write: StepWrite) -> None:
    if write.events:
        notify_events(run.id, run.last_seq + len(write.events))
    if write.next == "requeue":
        enqueue_iteration(run.id, run.step + 1)
