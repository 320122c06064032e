"""Sub-agents: the `Agent` tool (op `spawn`, SPEC 6.4) and the wake-up of parents.
Op `parallel_spawn` and its join are apps.runs.fanout's; a fan-out child's report goes there.

Invariants:
- A parent never waits on a child: the iteration that spawned commits with
  the parent parked at `waiting_children`, and its child runs are inserted
  in the SAME transaction as that fenced step commit (a lost fence leaves no
  orphan children). Children are enqueued after the commit.
- A child reports to its parent exactly once: a conditional UPDATE flips
  `reported_to_parent` on the child, in the transaction that appends the
  `tool_result` to the parent (`apps.runs.wake.run_answer`). The last
  pending answer flips the parent back to `running` and rings its doorbell
  on commit.
- A report lost to a crash is made by the sweeper (`children_report_sweep`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.core.errors import ApplicationError
from apps.core.ids import is_ident, new_run_id
from apps.core.tools import Park, SpawnRequest, Tool, ToolContext, ToolResult
from apps.gateway import fairness
from apps.gateway.providers import ToolCall
from apps.runs import fanout, store
from apps.runs.create import RunCreate, run_insert, run_resolve
from apps.runs.dispatch import enqueue_iteration
from apps.runs.lifecycle import Ended
from apps.runs.models import TERMINAL, Run, RunStatus, TranscriptEntry
from apps.runs.prompt import Segment
from apps.runs.resident_tool import OPS as RESIDENT_OPS
from apps.runs.resident_tool import resident_execute
from apps.runs.selectors import run_allowed_hosts_of, run_caller_tools
from apps.runs.wake import run_answer

log = logging.getLogger("loomcycle.subruns")

MAX_DEPTH = 3  # loomcycle's MaxAgentDepth: a top-level run is depth 0


def agent_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    op = data.get("op", "spawn")
    if op == "parallel_spawn":  # one park for up to 32 children (apps.runs.fanout)
        return fanout.parallel_spawn_execute(ctx, data)
    if op in RESIDENT_OPS:  # resident children (apps.runs.resident_tool)
        return resident_execute(ctx, data)
    if op != "spawn":
        return ToolResult(
            f"op {op!r} is unknown; one of spawn, parallel_spawn, {', '.join(RESIDENT_OPS)}", is_error=True
        )
    name, prompt = data.get("name"), data.get("prompt")
    if not isinstance(name, str) or not is_ident(name):
        return ToolResult("name must be an agent name ([A-Za-z0-9_-]{1,128})", is_error=True)
    if not isinstance(prompt, str) or not prompt.strip():
        return ToolResult("prompt must be a non-empty string", is_error=True)
    return ToolResult("", spawn=SpawnRequest(agent=name, prompt=prompt))


AGENT_TOOL = Tool(
    name="Agent",
    description="Run a sub-agent: op=spawn with {name, prompt}. The result is the sub-agent's final text, "
    "prefixed with [sub-agent agent_id=...]. op=parallel_spawn with spawns:[{name, prompt, parent_context?}] "
    "(at most 32) runs them all (max_concurrent_children at a time) and answers once with "
    '{"results":[{index, agent, ok, output?, error?}]}, index-aligned. A resident sub-agent stays alive between '
    "messages: op=open {name, prompt} (answers its first reply and child_run_id), op=send {child_run_id, prompt} "
    "(answers its reply), op=poll {child_run_id}, op=cancel {child_run_id}, op=close {child_run_id}.",
    input_schema={
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": ["spawn", "parallel_spawn", *RESIDENT_OPS]},
            "name": {"type": "string"},
            "prompt": {"type": "string"},
            "spawns": {
                "type": "array",
                "maxItems": 32,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "prompt": {"type": "string"},
                        "parent_context": {"type": "object"},
                    },
                    "required": ["name", "prompt"],
                },
            },
            "child_run_id": {"type": "string"},
            "timeout_ms": {"type": "integer", "minimum": 1},
            "idle_ttl_seconds": {"type": "integer", "minimum": 1},
        },
    },
    execute=agent_execute,
)


@dataclass(frozen=True)
class Spawn:
    call: ToolCall
    request: SpawnRequest
    resolved: Any  # create.Resolved
    caller_tools: list[str] | None = None  # the top-level caller's narrowing, inherited
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)  # the parent's, inherited
    run_id: str = ""  # the child's id, chosen when its fairness slot was taken (spawn_prepare)


def spawn_prepare(
    *,
    tenant_id: str,
    user_id: str,
    depth: int,
    call: ToolCall,
    request: SpawnRequest,
    user_tier: str | None = None,
    parent_id: str | None = None,
    credentials: Mapping[str, str] | None = None,
    interactive: bool = False,
) -> Spawn:
    """Resolve the child before any write; refusals become the call's is_error result.
    The child inherits its parent's caller narrowing: a caller who narrowed a
    run's tools narrowed every sub-agent it spawns (the child's own agent
    definition still decides what it may have inside that). It inherits its
    parent's credentials exactly (a tool cannot add any: ⊆ the parent's). Its
    network hosts are the parent's effective list as its caller's
    `allowed_hosts`, so at most the parent's (none when there is no parent to
    inherit from). Its volumes are its own bindings within its parent's, never wider.

    The child counts against its tenant's and user's run caps as its root does
    (apps.gateway.fairness): its slot is taken here, before the parent's step
    commit, so a child over a cap is refused like an unknown agent (the call's
    is_error result names the cap) and the parent's model decides what to do; no
    worker waits for a slot. The slot is given back when the child ends, or by
    `spawns_abandon` when the parent's step drops it (a slot leaked by a crash in
    between is freed by the reconcile sweep, as a top-level run's)."""
    if depth + 1 > MAX_DEPTH:
        raise ApplicationError(f"sub-agent depth limit ({MAX_DEPTH}) reached; cannot spawn {request.agent!r}")
    data = _child_create(
        request=request, user_id=user_id, user_tier=user_tier, parent_id=parent_id, interactive=interactive
    )
    resolved = run_resolve(tenant_id=tenant_id, data=data)
    inherited = dict(credentials or {})
    run_id = new_run_id()
    fairness.run_slot_take(run_id=run_id, tenant_id=tenant_id, user_id=user_id)  # SlotRefused over a cap
    return Spawn(
        call=call, request=request, resolved=resolved, caller_tools=data.tools, credentials=inherited, run_id=run_id
    )


def _child_create(
    *, request: SpawnRequest, user_id: str, user_tier: str | None, parent_id: str | None, interactive: bool
) -> RunCreate:
    """The child's create request: its own prompt, within its parent's caller narrowing and hosts."""
    return RunCreate(
        agent=request.agent,
        segments=[Segment(text=request.prompt)],
        user_id=user_id,
        user_tier=user_tier,
        tools=run_caller_tools(parent_id) if parent_id else None,
        allowed_hosts=run_allowed_hosts_of(parent_id) if parent_id else [],
        parent_id=parent_id,  # its volumes are resolved within the parent's (registry.resolve_volumes)
        # True for a resident child (apps.runs.resident_tool) only: a spawn / parallel_spawn child
        # must end and report, whatever its agent definition's `interactive` says.
        interactive=interactive,
    )


def spawns_abandon(spawns: list[Spawn], parks: list[Park]) -> None:
    """The parent's step dropped these spawns and parks (a lost fence, a cancel, a
    turn-cancel): give back the fairness slots their children took, and nothing else."""
    for s in spawns:
        fairness.run_slot_release(s.run_id)
    for park in parks:
        if park.abandon is not None:
            park.abandon()


def children_insert(*, parent_id: str, tenant_id: str, user_id: str, depth: int, spawns: list[Spawn]) -> list[str]:
    """Inside the parent's step-commit transaction."""
    ids = []
    for s in spawns:
        data = RunCreate(
            agent=s.request.agent,
            segments=[Segment(text=s.request.prompt)],
            user_id=user_id,
            parent_id=parent_id,
            tools=s.caller_tools,
            credentials=s.credentials,
        )
        child = run_insert(
            tenant_id=tenant_id,
            data=data,
            resolved=s.resolved,
            depth=depth + 1,
            parent_call_id=s.call.id,
            run_id=s.run_id or None,
        )
        ids.append(child.id)
    return ids


def children_enqueue(child_ids: list[str]) -> None:
    for child_id in child_ids:
        enqueue_iteration(child_id, 0)


def _child_result(child: Run) -> tuple[str, bool]:
    if child.status == RunStatus.COMPLETED:
        last = (
            TranscriptEntry.objects.filter(run_id=child.id, role="assistant")
            .order_by("-idx")
            .values_list("content", flat=True)
            .first()
        )
        text = "".join(b.get("text", "") for b in (last or []) if b.get("type") == "text")
        return f"[sub-agent agent_id={child.agent_id}]\n{text}", False
    why = child.error or child.stop_reason or child.status
    return f"[sub-agent agent_id={child.agent_id}] {child.status}: {why}", True


def on_run_ended(ended: Ended) -> None:
    """apps.runs.lifecycle subscriber (children): the child reports to its parent."""
    run_child_finished(child_id=ended.run_id)


def run_child_finished(*, child_id: str) -> bool:
    """Report a terminal child to its parent, exactly once. False if nothing to do."""
    fanout_id = fanout.fanout_of(child_id)
    if fanout_id is not None:  # a parallel_spawn or runs:batch child: its join answers (apps.runs.fanout)
        return fanout.fanout_child_finished(child_id=child_id, fanout_id=fanout_id)
    with transaction.atomic():
        # Compare-and-set: only the first report of this child proceeds.
        if not store.child_report_claim(child_id=child_id):
            return False
        child = Run.objects.get(id=child_id)
        text, is_error = _child_result(child)
        run_answer(
            run_id=str(child.parent_id), call_id=child.parent_call_id, tool_name="Agent", text=text, is_error=is_error
        )
    return True


def children_report_sweep(*, settle_seconds: float = 2.0) -> int:
    """Children that ended but whose report was lost (a crash between their
    commit and the report)."""
    cutoff = timezone.now() - timedelta(seconds=settle_seconds)
    ids = list(
        Run.objects.filter(
            parent__isnull=False, reported_to_parent=False, status__in=TERMINAL, completed_at__lt=cutoff
        ).values_list("id", flat=True)[:500]
    )
    reported = sum(run_child_finished(child_id=i) for i in ids)
    reported += fanout.batch_report_sweep(settle_seconds=settle_seconds)  # runs:batch children have no parent
    if reported:
        log.info("sweeper reported %d finished child run(s) to their parents", reported)
    return reported
