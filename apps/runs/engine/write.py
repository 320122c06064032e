"""What one iteration commits (StepWrite) and the writes that end a step: a finished
turn, a cancel, a failure."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from apps.core.metrics import Batch
from apps.core.spend import Crossing
from apps.core.tools import Park
from apps.runs import signals
from apps.runs.children.spawn import Spawn
from apps.runs.compaction import plan as compacting
from apps.runs.models import RunStatus
from apps.runs.store import ClaimedRun, Switched


class Next(StrEnum):
    """Where a committed iteration leaves the run."""

    REQUEUE = "requeue"  # ring the next step's doorbell
    PARK = "park"  # wait (input, children, a channel, a pause) without a worker
    FINISH = "finish"  # terminal


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
    # The step's tool batch (call_id, name, input), recorded by the commit: finished or, parked or spawned, started.
    tool_batch: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    tools_started_at: float = 0.0  # time.time() when the batch began
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
    budget_held: bool = False  # budgets were in scope: settle after the commit (apps.runs.engine.budget)
    budget_wait: Crossing | None = None  # the deferring limit a waiting_budget park waits on
    armed: int | None = None  # the token of the next step's lease the commit armed (its doorbell carries it)


def end_turn(run: ClaimedRun, write: StepWrite, stop_reason: str) -> StepWrite:
    if run.interactive:
        write.events.append({"type": "awaiting_input", "awaiting_input": {"since_turn": run.step + 1}})
        write.status, write.next, write.stop_reason = RunStatus.AWAITING_INPUT, Next.PARK, stop_reason
        return write
    return finish(write, stop_reason or "end_turn")


def finish(write: StepWrite, stop_reason: str) -> StepWrite:
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
