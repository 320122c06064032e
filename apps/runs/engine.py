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

A tool may park its call (`ToolResult.park`): the step commits with the run
parked and the wait recorded in the same transaction; whoever answers the
call later resumes the run through `apps.runs.wake.run_answer`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial
from typing import Any

import psycopg
from django.conf import settings
from django.db import OperationalError, connection, transaction
from redis.exceptions import RedisError

from apps.core import logcontext, privileged
from apps.core.admission import ADMISSION, tools_after_s
from apps.core.database import connection_lost
from apps.core.errors import ApplicationError
from apps.core.metrics import Batch
from apps.core.redact import run_redactor
from apps.core.redis import sync_client
from apps.core.tools import Park, ToolContext, ToolResult, VolumeBinding
from apps.gateway import fairness
from apps.gateway.pricing import cost_usd
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
    has_provider,
)
from apps.gateway.resolver import Candidate, Policy
from apps.runs import compacting, metrics, registry, resident, signals, store, tracing, turncancel
from apps.runs.credentials import CredentialsUnreadable, unseal
from apps.runs.dispatch import notify_events, record_timing, wake_and_enqueue
from apps.runs.lifecycle import Ended, run_ended
from apps.runs.live import LIVE, WORKER_ID
from apps.runs.models import Run, RunStatus
from apps.runs.prompt import messages_from_rows
from apps.runs.sessions import replayed_history
from apps.runs.store import ClaimedRun, StepRows, Switched
from apps.runs.subruns import (
    Spawn,
    children_enqueue,
    children_insert,
    spawn_prepare,
    spawns_abandon,
)
from apps.runs.toolrun import CallOutcome, run_calls
from apps.runs.turncancel import CutKind, TurnCut
from apps.substrate.selectors import agent_def_is_operator_yaml

log = logging.getLogger("loomcycle.engine")

REASONING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


class Next(StrEnum):
    """Where a committed iteration leaves the run."""

    REQUEUE = "requeue"  # ring the next step's doorbell
    PARK = "park"  # wait (input, children, a channel, a pause) without a worker
    FINISH = "finish"  # terminal


class Outcome(StrEnum):
    """What one delivery of a doorbell did (`run_iterate`'s result)."""

    NOOP = "noop"  # lost the claim: a stale, future or duplicate doorbell
    FENCE_LOST = "fence_lost"  # the lease moved on during the iteration: its work was discarded
    HANDED_BACK = "handed_back"  # the database went away mid-iteration: the claim was released uncommitted
    REQUEUE = Next.REQUEUE.value
    PARK = Next.PARK.value
    FINISH = Next.FINISH.value


@dataclass
class StepWrite:
    """What one iteration commits, and where it leaves the run (`next`)."""

    status: str
    next: Next
    events: list[dict[str, Any]] = field(default_factory=list)
    transcript: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    stop_reason: str = ""
    error: str = ""
    consumed_inputs: list[int] = field(default_factory=list)
    finished_calls: list[tuple[str, bool]] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)  # usage/cost rows, one per provider call
    advance: bool = True  # False for a pause park: no provider call was made
    provider_s: float = 0.0  # time inside the provider call(s), for timing samples
    spawns: list[Spawn] = field(default_factory=list)  # sub-agents to start with this commit
    parks: list[tuple[str, Park]] = field(default_factory=list)  # (call_id, park): calls answered later
    child_ids: list[str] = field(default_factory=list)
    switched: Switched | None = None  # the candidate a provider fallback moved to
    deliveries: list[signals.Delivery] = field(default_factory=list)  # lifecycle signals recorded with the commit
    metrics: Batch = field(default_factory=Batch)  # provider and tool calls made, flushed after the commit
    compact: list[compacting.Request] = field(default_factory=list)  # compaction requests drained this step


def run_iterate(*, run_id: str, step: int) -> Outcome:
    """Execute iteration `step` of `run_id` if this delivery wins the claim
    (after this process admits it: apps.core.admission). Log records made
    meanwhile carry the run's ids (apps.core.logcontext)."""
    with logcontext.bound(run_id=run_id, step=step), ADMISSION.admitted() as waited:
        return _iterate(run_id, step, waited)


def _iterate(run_id: str, step: int, waited: float) -> Outcome:
    started = time.perf_counter()
    with LIVE.track(run_id) as cancel:
        run = _claim(run_id, step)
        if run is None:
            return Outcome.NOOP
        LIVE.set_token(run_id, run.lease_token)
        logcontext.update(tenant=run.tenant_id)
        span = tracing.iteration_start(run, WORKER_ID)
        with tracing.active(span):
            if run.first_claim:
                notify_events(run.id, run.last_seq)  # `started` is visible to stream readers now
            write = _execute_or_lost(run, cancel)
            committed = _commit(run, write) if write is not None else None
    if write is None:  # the database connection was lost: nothing of this attempt is kept
        with tracing.active(span, end=True):
            tracing.iteration_done(span, outcome=Outcome.HANDED_BACK.value, status=None, events=0)
        _flush_metrics(StepWrite(status=run.status, next=Next.REQUEUE), Outcome.HANDED_BACK, None, 0.0)
        return _hand_back(run)
    # Outside LIVE.track (the next step may already be claimed in this process), inside the
    # iteration's span: the next doorbell carries it (workers/doorbell.py).
    with tracing.active(span, end=True):
        outcome = _settle(run, write, committed)
        tracing.iteration_done(span, outcome=outcome.value, status=committed, events=len(write.events))
    elapsed = time.perf_counter() - started
    if committed is None:  # the lease fence was lost: the iteration was discarded (Outcome.FENCE_LOST)
        _flush_metrics(write, outcome, None, 0.0)
        return outcome
    record_timing(elapsed, write.provider_s, waited)
    _flush_metrics(write, outcome, committed, elapsed)
    _log_outcome(run, write, committed, elapsed)
    return outcome


def _execute_or_lost(run: ClaimedRun, cancel: threading.Event) -> StepWrite | None:
    """The iteration's write; None when it lost its database connection (a Postgres
    restart or failover, `apps.core.database.connection_lost`) before its commit."""
    try:
        return _open_credentials(run) or _execute(run, cancel)
    except Exception as exc:
        if not connection_lost(exc):
            raise
        log.warning("run %s step %s lost the database connection mid-iteration (%s)", run.id, run.step, exc)
        return None


# Hand-backs of one step that do not count as attempts. A database that goes away every
# time the step runs (a tool whose query takes the server down) is the step's doing: past
# this many, its hand-backs count, and LOOMCYCLE_MAX_ATTEMPTS ends it as a poison iteration.
HAND_BACKS_FREE = 5
HAND_BACK_KEY_TTL_S = 3600


def _hand_back(run: ClaimedRun) -> Outcome:
    """Release the claim uncommitted and ring the step's doorbell again, without waiting
    for the lease to expire. The attempt is not counted (up to HAND_BACKS_FREE per step):
    a database that went away is not the iteration failing, and LOOMCYCLE_MAX_ATTEMPTS is
    the limit on lost workers. Should the database stay away for a whole lease, this raises,
    and the sweeper takes the run back once its lease has expired, as after a crash."""
    free = _hand_back_free(run.id, run.step)
    if store.claim_hand_back(run_id=run.id, step=run.step, token=run.lease_token, free=free):
        wake_and_enqueue(run.id, None, run.step)
    return Outcome.HANDED_BACK


def _hand_back_free(run_id: str, step: int) -> bool:
    """Whether this hand-back of (run, step) is within HAND_BACKS_FREE (a Redis counter;
    when Redis does not answer either, the attempt counts)."""
    key = f"lc:handback:{run_id}:{step}"
    try:
        pipe = sync_client().pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, HAND_BACK_KEY_TTL_S)
        count = int(pipe.execute()[0])
    except RedisError as exc:
        log.warning("run %s step %s: hand-back not counted in Redis (%s); the attempt counts", run_id, step, exc)
        return False
    return count <= HAND_BACKS_FREE


def _settle(run: ClaimedRun, write: StepWrite, committed: str | None) -> Outcome:
    """After the commit: what the iteration did, and (when it committed) its after-commit work."""
    if committed is None:
        log.warning("run %s step %s: lease fence lost, iteration discarded", run.id, run.step)
        return Outcome.FENCE_LOST
    if committed != write.status:  # input or a cancel arrived during the step: it rang instead of parking
        write.next = Next.REQUEUE
    _after_commit(run, write)
    return Outcome(write.next.value)


def _log_outcome(run: ClaimedRun, write: StepWrite, committed: str, elapsed: float) -> None:
    """One DEBUG line per committed iteration; one INFO line (WARNING when failed) per run
    that finished, with its stop reason or its error, redacted as the store redacts it."""
    if write.next != Next.FINISH:
        log.debug("iteration committed: %s, %s (%.1f ms)", committed, write.next.value, elapsed * 1000)
        return
    level = logging.WARNING if committed == RunStatus.FAILED else logging.INFO
    reason = run_redactor(run.credentials).text(write.error) if write.error else write.stop_reason
    log.log(level, "run finished: %s (%s)", committed, reason or "no reason given")


def _flush_metrics(write: StepWrite, outcome: Outcome, committed: str | None, elapsed: float) -> None:
    """The iteration's counters, with the provider and tool calls it made, in one
    Redis round trip (apps.core.metrics); nothing when metrics are off."""
    if not settings.LOOMCYCLE.metrics_enabled:
        return
    batch = write.metrics
    batch.inc(metrics.ITERATIONS, (outcome.value,))
    if committed is not None:
        batch.observe(metrics.ITERATION_SECONDS, (), elapsed)
    if committed is not None and outcome == Outcome.FINISH:
        batch.inc(metrics.RUNS_FINISHED, (committed,))
    batch.flush()


def _claim(run_id: str, step: int) -> ClaimedRun | None:
    lease = settings.LOOMCYCLE.lease_seconds
    try:
        run = store.claim(run_id=run_id, step=step, owner=WORKER_ID, lease_seconds=lease)
    except (psycopg.OperationalError, OperationalError):  # the database stayed away (store._hot retried for a lease)
        wake_and_enqueue(run_id, None, step)  # the claim did not commit: no attempt, and the doorbell rings on
        raise
    if run is not None and run.attempts > 1:  # an earlier claim of this iteration never committed
        log.warning(
            "run %s step %s claimed again (attempt %d): an earlier attempt did not commit", run_id, step, run.attempts
        )
    return run


def _open_credentials(run: ClaimedRun) -> StepWrite | None:
    """Open the run's sealed credentials into `run.credentials` (this
    iteration's memory only); a failed write when they do not open here."""
    try:
        run.credentials = unseal(run_id=run.id, sealed=run.credentials_sealed)
    except CredentialsUnreadable as exc:
        return failed_write(str(exc))
    return None


def _execute(run: ClaimedRun, cancel: threading.Event) -> StepWrite:
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
        return _finish(write, "max_iterations")
    rows = _load_rows(run, write)
    connection.close()  # hand the connection back to the pool before the provider call
    try:
        if _compact(run, rows, write, cancel):
            return _repark(run, write)
    except ProviderCancelled:  # the summary call was cut: nothing of it is kept
        return _model_cut(run, write, None)
    if cut.kind is CutKind.TURN:  # flagged before this turn's model call: its input is kept, nothing else ran
        return _turn_cancelled(run, write, cut.reason)
    try:
        reply_text, calls, done = _call_model(run, messages_from_rows(rows), cancel, write)
    except ProviderCancelled as exc:
        return _model_cut(run, write, exc)
    except ProviderError as exc:
        write.events.append({"type": "error", "error": str(exc)})
        write.status, write.next, write.error = RunStatus.FAILED, Next.FINISH, str(exc)
        write.stop_reason = exc.stop_reason
        return write
    _record_reply(run, write, reply_text, calls, done)
    if calls:
        return _run_tools(run, calls, cancel, write, done)
    return _end_turn(run, write, done.stop_reason)


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
    return _turn_cancelled(run, write, cut.reason)


def _turn_cancelled(run: ClaimedRun, write: StepWrite, reason: str) -> StepWrite:
    """SPEC 4.7: the turn ends here; the run parks for input as an ended turn does."""
    write.events.append(turncancel.turn_cancelled_event(run, reason))
    return _end_turn(run, write, turncancel.STOP_REASON)


def _load_rows(run: ClaimedRun, write: StepWrite) -> list[tuple[str, list[dict[str, Any]]]]:
    """The transcript with this step's drained inputs appended; a compaction request
    among them is noted in `write.compact` instead (apps.runs.compacting)."""
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
    """Compact before the model call when asked or due (apps.runs.compacting): the marker
    joins `rows` and the step's transcript. True when that was all this wake was for."""
    only = compacting.only_compacts(run, rows, write.compact)
    plan = compacting.plan(run, rows, write.compact)
    if isinstance(plan, compacting.Skipped):
        write.events.append(compacting.skipped_event(plan))
    elif plan is not None:
        retries = Policy(**(run.routing or {}).get("policy") or {}).retry_attempts
        try:
            summary, _, done = _call_with_retries(run.provider, plan.request, cancel, write, retries)
        except ProviderError as exc:  # the history stays as it was; the model call goes on with it
            log.warning("run %s: compaction's summary call failed: %s", run.id, exc)
            write.events.append(compacting.failed_event(plan, exc))
            return only
        write.events.append({"type": "usage", "usage": done.usage.as_dict()})
        _record_usage(run, write, done)
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


def _call_model(
    run: ClaimedRun, messages: list[dict[str, Any]], cancel: threading.Event, write: StepWrite
) -> tuple[str, list[ToolCall], Done]:
    """The provider call of this iteration, in its span (retries and fallbacks are its events)."""
    offered = registry.resolve(run.tools, tenant_id=run.tenant_id)
    tools = [ToolSpec(t.name, t.description, t.input_schema) for t in offered]
    with tracing.provider_call(run, messages=len(messages), tools=len(tools)) as span:
        text, calls, done = _call_candidates(run, messages, tools, cancel, write)
        tracing.provider_reply(span, done, calls)
        return text, calls, done


def _call_candidates(
    run: ClaimedRun, messages: list[dict[str, Any]], tools: list[ToolSpec], cancel: threading.Event, write: StepWrite
) -> tuple[str, list[ToolCall], Done]:
    """Call the run's current candidate; a retryable failure first uses the
    same-provider retries, then (policy permitting) falls back to the next
    candidate (SPEC 7.4). The switch is committed with the step."""
    routing = run.routing or {}
    candidates = [Candidate(**c) for c in routing.get("candidates") or []] or [Candidate(run.provider, run.model)]
    policy = Policy(**routing.get("policy") or {})
    idx = min(run.candidate_idx, len(candidates) - 1)
    fallbacks = run.fallbacks
    while True:
        cand = candidates[idx]
        request = ProviderRequest(
            model=cand.model,
            system=list(run.system),
            messages=messages,
            tools=tools,
            max_tokens=run.max_tokens,
            sampling=dict(routing.get("sampling") or {}),
            effort=str(routing.get("effort") or ""),
            run_id=run.id,
        )
        try:
            result = _call_with_retries(cand.provider, request, cancel, write, policy.retry_attempts)
        except ProviderError as exc:
            nxt = _fallback_target(run, exc, idx, len(candidates), fallbacks, policy, write)
            if nxt is None:
                raise
            messages = _switch(run, write, candidates[idx], candidates[nxt], exc, fallbacks + 1, messages)
            idx, fallbacks = nxt, fallbacks + 1
            write.switched = Switched(candidates[idx].provider, candidates[idx].model, idx, fallbacks)
            continue
        return result


def _fallback_target(
    run: ClaimedRun, exc: ProviderError, idx: int, count: int, fallbacks: int, policy: Policy, write: StepWrite
) -> int | None:
    """The candidate to switch to after `exc`, or None to fail the run."""
    if not exc.retryable or not policy.fallback_on_error or idx + 1 >= count:
        return None
    if fallbacks >= policy.max_fallback_attempts:
        write.events.append(
            {"type": "fallback_suppressed", "text": f"max_fallback_attempts ({policy.max_fallback_attempts}) reached"}
        )
        return None
    if settings.LOOMCYCLE.fallback_pin_after_success and run.step > 0:
        write.events.append(
            {
                "type": "fallback_suppressed",
                "text": f"pinned to {run.provider}/{run.model} after a successful turn "
                "(LOOMCYCLE_FALLBACK_PIN_AFTER_SUCCESS)",
            }
        )
        return None
    return idx + 1


def _switch(
    run: ClaimedRun,
    write: StepWrite,
    failed: Candidate,
    new: Candidate,
    exc: ProviderError,
    attempt: int,
    messages: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Record the switch; the history the new provider sees drops the old one's reasoning."""
    tracing.provider_event(
        "provider.fallback",
        {
            "loomcycle.failed_provider": failed.provider,
            "loomcycle.failed_model": failed.model,
            "loomcycle.new_provider": new.provider,
            "loomcycle.new_model": new.model,
            "loomcycle.provider_status": exc.status,
            "loomcycle.attempt": attempt,
        },
    )
    write.events.append(
        {
            "type": "provider_fallback",
            "fallback": {
                "failed_provider": failed.provider,
                "failed_model": failed.model,
                "new_provider": new.provider,
                "new_model": new.model,
                "attempt": attempt,
                "user_tier": (run.routing or {}).get("user_tier", ""),
                "reason": "rate_limited" if exc.status == 429 else "provider_error",
                "cause_error": str(exc),
            },
        }
    )
    cached = has_provider(failed.provider) and get_provider(failed.provider).capabilities.native_prompt_cache
    if failed.provider != new.provider and cached:
        write.events.append({"type": "cache_invalidated", "text": f"prompt cache on {failed.provider} left behind"})
    stripped = strip_reasoning(messages)
    if stripped is not messages:
        write.events.append(
            {"type": "reasoning_invalidated", "text": f"reasoning from {failed.provider} removed from the history"}
        )
    return stripped


def strip_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages without thinking blocks (the same list when there are none)."""
    if not any(b.get("type") in REASONING_BLOCKS for m in messages for b in m["content"]):
        return messages
    out = []
    for m in messages:
        content = [b for b in m["content"] if b.get("type") not in REASONING_BLOCKS]
        if content:
            out.append({**m, "content": content})
    return out


def _call_with_retries(
    provider_id: str, request: ProviderRequest, cancel: threading.Event, write: StepWrite, retries: int
) -> tuple[str, list[ToolCall], Done]:
    if not has_provider(provider_id):  # configured where the run was created, not on this worker
        raise ProviderError(provider_id, 503, "provider is not configured on this worker (check its key/yaml)")
    provider = get_provider(provider_id)
    for attempt in range(1, retries + 2):
        t0 = time.perf_counter()
        result = "error"
        try:
            try:
                # a remote call gives the engine to other iterations; provider_slot: its max_concurrent
                with ADMISSION.outside() if provider.capabilities.remote else nullcontext():
                    with fairness.provider_slot(provider.id, cancel=cancel):
                        reply = _consume(provider.stream(request, cancel))
                        result = "ok"
                        return reply
            except fairness.SlotRefused as refused:  # queued too long: retry/fall back like a provider 429
                raise ProviderError(provider.id, 429, refused.message, retry_after=5.0) from refused
        except ProviderError as exc:
            if not exc.retryable or attempt > retries:
                raise
            wait_s = exc.retry_after if exc.retry_after is not None else 0.5 * 2 ** (attempt - 1)
            wait_s = min(wait_s, 30.0) + random.uniform(0, 0.1)
            write.events.append({"type": "retry", "retry": _retry_info(provider.id, attempt, wait_s, exc)})
            tracing.provider_event(
                "provider.retry",
                {
                    "loomcycle.provider": provider.id,
                    "loomcycle.attempt": attempt,
                    "loomcycle.wait_ms": int(wait_s * 1000),
                    "loomcycle.provider_status": exc.status,
                },
            )
            with ADMISSION.outside():
                if cancel.wait(wait_s):
                    raise ProviderCancelled() from exc
        except ProviderCancelled:
            result = "cancelled"
            raise
        finally:
            seconds = time.perf_counter() - t0
            write.provider_s += seconds
            labels = (provider.id, request.model)
            write.metrics.inc(metrics.PROVIDER_CALLS, (*labels, result))
            write.metrics.observe(metrics.PROVIDER_SECONDS, labels, seconds)
    raise AssertionError("unreachable: the loop returns or raises")


def _retry_info(provider_id: str, attempt: int, wait_s: float, exc: ProviderError) -> dict[str, Any]:
    return {
        "provider": provider_id,
        "attempt": attempt,
        "wait_ms": int(wait_s * 1000),
        "reason": "retry-after header" if exc.retry_after is not None else "exponential backoff",
        "error": str(exc),
    }


def _consume(stream: Any) -> tuple[str, list[ToolCall], Done]:
    """Collect one model turn. Reasoning arrives as ThinkingDelta (shown as a
    `thinking` event) and, for replay, as Done.thinking blocks."""
    text: list[str] = []
    calls: list[ToolCall] = []
    done: Done | None = None
    try:
        for event in stream:
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, ToolCall):
                calls.append(event)
            elif isinstance(event, Done):
                done = event
            elif isinstance(event, ThinkingDelta):
                continue  # the whole reasoning is in done.thinking / the thinking event
    except ProviderCancelled as exc:  # what was streamed so far, for a turn-cancel (apps.runs.turncancel)
        raise TurnCut("".join(text), calls) from exc
    if done is None:
        raise ProviderError("engine", 502, "provider stream ended without a done event")
    return "".join(text), calls, done


def _record_reply(run: ClaimedRun, write: StepWrite, text: str, calls: list[ToolCall], done: Done) -> None:
    content: list[dict[str, Any]] = [dict(b) for b in done.thinking]  # replayed first, as Anthropic requires
    reasoning = "".join(str(b.get("thinking", "")) for b in done.thinking)
    if reasoning:
        write.events.append({"type": "thinking", "text": reasoning})
    if text:
        content.append({"type": "text", "text": text})
        write.events.append({"type": "text", "text": text})
    for call in calls:
        block = {"id": call.id, "name": call.name, "input": call.input}
        content.append({"type": "tool_use", **block})
        write.events.append({"type": "tool_call", "tool_use": block})
    if content:
        write.transcript.append(("assistant", content))
    write.events.append({"type": "usage", "usage": done.usage.as_dict()})
    _record_usage(run, write, done)


def _record_usage(run: ClaimedRun, write: StepWrite, done: Done) -> None:
    """One provider call's ledger row, and the run's usage totals with it."""
    usage = done.usage.as_dict()
    cost = cost_usd(done.usage.provider, done.usage.model, done.usage)
    write.ledger.append(
        {
            "provider": done.usage.provider,
            "model": done.usage.model,
            "input_tokens": done.usage.input_tokens,
            "output_tokens": done.usage.output_tokens,
            "cache_creation_input_tokens": done.usage.cache_creation_input_tokens,
            "cache_read_input_tokens": done.usage.cache_read_input_tokens,
            "cost_usd": None if cost is None else str(cost),
        }
    )
    write.usage = _add_usage(write.usage or run.usage or {}, usage)  # a compaction's call, then the turn's


def _add_usage(total: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    out = dict(total)
    for key, value in usage.items():
        out[key] = out.get(key, 0) + value if isinstance(value, int) else value
    return out


def _tools_now(run: ClaimedRun) -> list[str]:
    """The run's tools, less the privileged ones its agent may not use now (apps.core.privileged):
    a run created before the rule, or before its tenant left LOOMCYCLE_BASH_TENANTS, loses them."""
    tools = list(run.tools)
    if not any(privileged.is_privileged(name) for name in tools):
        return tools
    yaml = agent_def_is_operator_yaml(def_id=run.agent_def_id)
    return privileged.narrowed(tools, tenant_id=run.tenant_id, operator_yaml=yaml)


def _run_tools(
    run: ClaimedRun, calls: list[ToolCall], cancel: threading.Event, write: StepWrite, done: Done
) -> StepWrite:
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
        tools=tuple(_tools_now(run)),
        credentials=run.credentials,
        volumes=tuple(VolumeBinding.from_dict(v) for v in run.volumes or []),
        cancelled=cancel,
        allowed_hosts=tuple(run.allowed_hosts),
    )
    with ADMISSION.outside(tools_after_s()):
        ran = run_calls(base, calls)
    _count_tool_calls(run, ran, write)
    outcomes = _prepare_spawns(run, ran, write)
    cut = turncancel.cut_now(run.id) if cancel.is_set() else turncancel.NO_CUT
    if cut.kind is not CutKind.NONE:  # the spawns and parks of this batch are dropped with the turn or run
        spawns_abandon(write.spawns, [o.result.park for o in ran if o.result.park is not None])
    if cut.kind is CutKind.RUN:
        return cancelled_write(cut.reason)
    if cut.kind is CutKind.TURN:
        turncancel.keep_finished_calls(write, calls, ran)
        return _turn_cancelled(run, write, cut.reason)
    write.parks = [(o.call.id, o.result.park) for o in outcomes if o.result.park is not None]
    for o in outcomes:  # a parked call's own events (an interruption_pending) go out with the park
        if o.result.park is not None:
            write.events.extend(o.result.events)
    outcomes = [o for o in outcomes if o.result.park is None]
    by_id = {o.call.id: o.result for o in outcomes}
    for o in outcomes:  # events in completion order
        block = {"id": o.call.id, "name": o.call.name, "input": o.call.input}
        write.events.extend(o.result.events)
        write.events.append(
            {"type": "tool_result", "tool_use": block, "text": o.result.text, "is_error": o.result.is_error}
        )
        write.finished_calls.append((o.call.id, o.result.is_error))
    for call in (c for c in calls if c.id in by_id):  # transcript in tool_call order
        result = by_id[call.id]
        write.transcript.append(
            (
                "user",
                [{"type": "tool_result", "tool_use_id": call.id, "content": result.text, "is_error": result.is_error}],
            )
        )
    if write.spawns:  # park until the last child reports back
        write.status, write.next = RunStatus.WAITING_CHILDREN, Next.PARK
        return write
    if write.parks:  # park until every parked call is answered
        write.status, write.next = write.parks[0][1].status, Next.PARK
        return write
    if run.step + 1 >= run.max_iterations:
        return _finish(write, "max_iterations")
    return write


def _count_tool_calls(run: ClaimedRun, ran: list[CallOutcome], write: StepWrite) -> None:
    """A tool label is a name of the run's effective tool set (bounded); any name
    the model made up outside it counts under one label."""
    for o in ran:
        tool = o.call.name if o.call.name in run.tools else metrics.NOT_ALLOWED
        write.metrics.inc(metrics.TOOL_CALLS, (tool, metrics.result_label(o.result.is_error)))
        write.metrics.observe(metrics.TOOL_SECONDS, (tool,), o.seconds)


def _prepare_spawns(run: ClaimedRun, outcomes: list[CallOutcome], write: StepWrite) -> list[CallOutcome]:
    """Spawn requests become write.spawns; refused ones become is_error results now."""
    now: list[CallOutcome] = []
    for o in outcomes:
        if o.result.spawn is None:
            now.append(o)
            continue
        try:
            write.spawns.append(
                spawn_prepare(
                    tenant_id=run.tenant_id,
                    user_id=run.user_id,
                    depth=run.depth,
                    call=o.call,
                    request=o.result.spawn,
                    user_tier=(run.routing or {}).get("user_tier") or None,
                    parent_id=run.id,
                    credentials=run.credentials,  # inherited as they are: a child never holds more
                )
            )
        except ApplicationError as exc:
            now.append(
                CallOutcome(o.call, ToolResult(f"cannot spawn {o.result.spawn.agent!r}: {exc.message}", is_error=True))
            )
    if write.spawns:
        connection.close()
    return now


def _record_tool_starts(run: ClaimedRun, calls: list[ToolCall]) -> None:
    store.record_tool_starts(
        run_id=run.id,
        step=run.step,
        calls=[(c.id, c.name, c.input) for c in calls],
        redactor=run_redactor(run.credentials),
    )
    connection.close()


def _end_turn(run: ClaimedRun, write: StepWrite, stop_reason: str) -> StepWrite:
    if run.interactive:
        write.events.append({"type": "awaiting_input", "awaiting_input": {"since_turn": run.step + 1}})
        write.status, write.next, write.stop_reason = RunStatus.AWAITING_INPUT, Next.PARK, stop_reason
        return write
    return _finish(write, stop_reason or "end_turn")


def _finish(write: StepWrite, stop_reason: str) -> StepWrite:
    write.status, write.next, write.stop_reason = RunStatus.COMPLETED, Next.FINISH, stop_reason
    write.events.append({"type": "done", "stop_reason": stop_reason, "usage": write.usage or {}})
    return write


def cancelled_write(reason: str) -> StepWrite:
    reason = reason or "cancelled by api"
    return StepWrite(
        status=RunStatus.CANCELLED,
        next=Next.FINISH,
        stop_reason=reason,
        events=[{"type": "done", "stop_reason": reason, "cancelled": True}],
    )


def failed_write(error: str) -> StepWrite:
    return StepWrite(status=RunStatus.FAILED, next=Next.FINISH, error=error, events=[{"type": "error", "error": error}])


def _commit(run: ClaimedRun, write: StepWrite) -> str | None:
    """The committed status (store.commit_step), None when the fence was lost."""
    rows = StepRows(
        transcript=write.transcript,
        events=write.events,
        consumed_inputs=write.consumed_inputs,
        finished_calls=write.finished_calls,
        ledger=write.ledger,
    )
    commit = partial(
        store.commit_step,
        run=run,
        status=write.status,
        advance=write.advance,
        finish=write.next == Next.FINISH,
        stop_reason=write.stop_reason,
        error=write.error,
        usage=write.usage,
        rows=rows,
        pending_calls=len(write.spawns) + len(write.parks),
        switched=write.switched,
        redactor=run_redactor(run.credentials),
    )
    try:
        if not write.spawns and not write.parks and not _signalled(write):
            return commit()  # one autocommit statement: the hot path when no signal of this step has a receiver
        # Children, waits and the signals' outbox rows exist iff the parent's fenced step commits.
        with transaction.atomic():
            status = commit()
            if status != write.status:  # fence lost, or a cancel turned the park into a doorbell
                spawns_abandon(write.spawns, [park for _, park in write.parks])
                write.spawns, write.parks = [], []
            if write.spawns:
                write.child_ids = children_insert(
                    parent_id=run.id, tenant_id=run.tenant_id, user_id=run.user_id, depth=run.depth, spawns=write.spawns
                )
            for call_id, park in write.parks:
                park.record(run.id, run.step, call_id)
            if status is not None:
                write.deliveries = _record_signals(run, write, final=status == write.status)
            return status
    finally:
        connection.close()


def _after_commit(run: ClaimedRun, write: StepWrite) -> None:
    wake_and_enqueue(
        run.id,
        run.last_seq + len(write.events) if write.events else None,
        run.step + int(write.advance) if write.next == Next.REQUEUE else None,
    )
    children_enqueue(write.child_ids)
    for call_id, park in write.parks:
        try:
            park.after_commit(run.id, call_id)
        except Exception:  # the wait row is committed: the beat sweep answers it
            log.exception("run %s call %s: the post-park check failed; the wake sweep will answer it", run.id, call_id)
        finally:
            connection.close()
    _resident_turn_ended(run, write)
    if write.next == Next.FINISH:  # the run's end: every after-effect, as a cancel's (apps.runs.lifecycle)
        ended = Ended(run.id, write.status, run.parent_id, run.notify_finished, tuple(run.tools))
        run_ended(ended, close_connection=True)
    # Last: the deployment's receivers never delay or abort the runtime's own after-commit work.
    signals.deliver_all(write.deliveries, close_connection=True)


def _resident_turn_ended(run: ClaimedRun, write: StepWrite) -> None:
    """A resident child's turn ended (its parent's waiting call is answered: apps.runs.resident).
    Other runs pay nothing; a run's end closes its resident rows through apps.runs.lifecycle."""
    if not (run.parent_id and write.next == Next.PARK and write.status == RunStatus.AWAITING_INPUT):
        return
    try:
        resident.resident_turn_ended(child_id=run.id)
    finally:
        connection.close()


def _signalled(write: StepWrite) -> bool:
    """Whether this step may send a lifecycle signal that has a receiver (then its commit is a transaction
    holding the outbox rows). A spawning step is a transaction anyway; no receiver: False, no query."""
    return (
        (signals.tool_called.has_listeners(Run) and any(e.get("type") == "tool_result" for e in write.events))
        or (write.next == Next.PARK and signals.run_parked.has_listeners(Run))
        or (write.next == Next.FINISH and signals.run_finished.has_listeners(Run))
    )


def _record_signals(run: ClaimedRun, write: StepWrite, *, final: bool) -> list[signals.Delivery]:
    """The outbox rows of this step's lifecycle signals (apps.runs.signals), inside the step's transaction;
    only those with a receiver. `final`: the step committed the status it meant (not a park or finish
    turned into a doorbell), so its park or finish is signalled."""
    recorded: list[signals.Delivery | None] = []
    for event in write.events:
        if event.get("type") == "tool_result":
            use = event["tool_use"]
            recorded.append(
                signals.record(
                    signals.tool_called, run_id=run.id, call_id=use["id"], tool=use["name"], is_error=event["is_error"]
                )
            )
    for child_id in write.child_ids:
        recorded.append(
            signals.record(
                signals.run_created, run_id=child_id, tenant_id=run.tenant_id, user_id=run.user_id, parent_id=run.id
            )
        )
    if final and write.next == Next.PARK:
        recorded.append(signals.record(signals.run_parked, run_id=run.id, status=write.status))
    elif final and write.next == Next.FINISH:
        recorded.append(signals.record(signals.run_finished, run_id=run.id, status=write.status))
    return [delivery for delivery in recorded if delivery is not None]
