"""Sub-agents started by the Agent tool's `spawn` (SPEC 6.4): the child resolved before any
write, inserted with its parent's step, enqueued after it. Its report is
apps.runs.children.report's; `parallel_spawn` and its join are apps.runs.children.fanout's.

Invariants:
- A parent never waits on a child: the iteration that spawned commits with
  the parent parked at `waiting_children`, and its child runs are inserted
  in the SAME transaction as that fenced step commit (a lost fence leaves no
  orphan children). Children are enqueued after the commit.
- A child takes its fairness slot here, before its parent's commit; a spawn the
  parent's step drops gives it back (`spawns_abandon`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from apps.core.errors import ApplicationError
from apps.core.ids import new_run_id
from apps.core.tools import Park, SpawnRequest
from apps.gateway import fairness
from apps.gateway.providers import ToolCall
from apps.runs.create import RunCreate, run_insert, run_resolve
from apps.runs.dispatch import enqueue_iteration
from apps.runs.prompt import Segment
from apps.runs.selectors import run_allowed_hosts_of, run_caller_tools

MAX_DEPTH = 3  # loomcycle's MaxAgentDepth: a top-level run is depth 0


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
        # True for a resident child (apps.runs.children.resident_tool) only: a spawn / parallel_spawn child
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
