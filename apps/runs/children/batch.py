"""`POST /v1/runs:batch` (SPEC 2.3): up to 32 top-level runs. Mode `join`: one
`FanOut` join (apps.runs.children.fanout), then the request waits on the join. Mode
`detach` (loomcycle 1.124): the runs only, answered at once with their handles.

Invariants:
- The children, the join and its slots commit together (one transaction,
  a savepoint per child): a child refused at admission (unknown agent, 429,
  bad credentials) is an in-envelope failure, its slot inserted `reported`;
  the others start. Children are `notify_finished` runs: each one's end
  reaches the join through registry.on_run_finished (engine or cancel), and
  fanout.batch_report_sweep makes a report lost to a crash.
- The waiting request holds no thread per child and never polls the database
  in a tight loop: it subscribes to the join's Redis channel (announced after
  the completing report commits) and re-reads the join on each ring and every
  `REPOLL_S` as the backstop for a lost ring, until `timeout_ms`.
- On timeout the children still running are cancelled and the response says
  `timed_out: true`; their entries carry the status read then (a worker may
  still be landing the cancel) and the error `runs:batch timed out; run cancelled`.
- A detached batch has no join and takes no `timeout_ms`: its children commit
  together (a savepoint each) and go on after the answer like any background run.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection, transaction
from django.utils import timezone

from apps.core.errors import ApplicationError, Invalid, RuntimePaused, Unprocessable
from apps.core.pubsub import hub
from apps.core.types import Principal
from apps.runs import create, store
from apps.runs.cancel import run_cancel
from apps.runs.children import fanout
from apps.runs.fanout_models import FanOut, FanOutKind, FanOutSlot, SlotState
from apps.runs.models import TERMINAL, Run, RunStatus, RuntimeStateValue
from apps.runs.selectors import runtime_state

REPOLL_S = 5.0  # the backstop re-read of the join while no ring came
DEFAULT_TIMEOUT_MS = 300_000
TIMED_OUT = "runs:batch timed out"
MAX_TIMEOUT_MS = 1_800_000  # as the longest SSE stream (30 min)
MODES = ("join", "detach")


@dataclass(frozen=True)
class BatchSpawn:
    """One spawn of the request: the run to create and the context passed through to its entry."""

    create: create.RunCreate
    parent_context: dict[str, Any] | None = None


def batch_check(*, count: int, mode: str, timeout_ms: int | None) -> None:
    """SPEC 2.3's malformed batch, a 400: 0 or over 32 spawns, an unknown mode, a timeout on detach."""
    if not 1 <= count <= fanout.MAX_SPAWNS:
        raise Invalid(f"spawns must hold 1..{fanout.MAX_SPAWNS} runs (got {count})", code="invalid_spawns")
    if mode not in MODES:
        raise Invalid(f'mode must be "join" or "detach" (got {mode!r})', code="unsupported_mode")
    if mode == "detach" and timeout_ms is not None:
        raise Invalid('timeout_ms is refused with mode "detach", which does not wait', code="invalid_body")


def batch_start(*, principal: Principal, spawns: list[BatchSpawn]) -> str:
    """Create the children and their join (one transaction); the join's id."""
    batch_check(count=len(spawns), mode="join", timeout_ms=None)
    if any(s.create.interactive for s in spawns):
        raise Unprocessable(
            "a batch joins on its runs' ends: interactive runs (which park for input) are refused",
            code="interactive_not_allowed",
        )
    if runtime_state() != RuntimeStateValue.RUNNING:
        raise RuntimePaused("runtime is paused; retry after resume")
    try:
        with transaction.atomic():
            slots = [_child(principal, i, s) for i, s in enumerate(spawns)]
            refused = sum(s.run_id is None for s in slots)
            join = FanOut(
                id=fanout.new_fanout_id(),
                kind=FanOutKind.BATCH,
                tenant_id=principal.tenant_id,
                user_id=principal.subject,
                size=len(slots),
                reported=refused,
                max_concurrent=len(slots),
                completed_at=timezone.now() if refused == len(slots) else None,  # nothing to wait for
            )
            for slot in slots:
                slot.fanout = join
            store.fanout_insert(join, slots)
        return join.id
    finally:
        connection.close()


def batch_detach(*, principal: Principal, spawns: list[BatchSpawn]) -> dict[str, Any]:
    """Mode detach: create the children (one transaction, no join) and answer their handles;
    each goes on after the call. A child refused at admission is a failed entry in its slot."""
    batch_check(count=len(spawns), mode="detach", timeout_ms=None)
    if runtime_state() != RuntimeStateValue.RUNNING:
        raise RuntimePaused("runtime is paused; retry after resume")
    try:
        with transaction.atomic():
            slots = [_child(principal, i, s, join=False) for i, s in enumerate(spawns)]
        runs = {r.id: r for r in Run.objects.filter(id__in=[s.run_id for s in slots if s.run_id])}
    finally:
        connection.close()
    results = [_detached_entry(slot, runs.get(slot.run_id or "")) for slot in slots]
    return {"results": results, "spawned": len(runs)}


def _detached_entry(slot: FanOutSlot, run: Run | None) -> dict[str, Any]:
    """A detached child's handle: `running`, or loomcycle's `queued` while it waits for a run slot."""
    if run is None:
        return _entry(fanout.ChildView(slot=slot, run=None, final_text=""), frozenset())
    status = "queued" if run.status == RunStatus.WAITING_SLOT else "running"
    return {
        **_entry(fanout.ChildView(slot=slot, run=run, final_text=""), frozenset()),
        "status": status,
        "error": "",
    }


def _child(principal: Principal, index: int, spawn: BatchSpawn, *, join: bool = True) -> FanOutSlot:
    """One child in its own savepoint; a refusal becomes a reported slot with its error."""
    agent = spawn.create.agent
    try:
        with transaction.atomic():
            # A joined child is never interactive, whatever the agent's definition says: the join
            # waits for its end. A detached one is an ordinary run, reporting to no join.
            data = spawn.create
            if join:
                data = dataclasses.replace(data, notify_finished=True, interactive=False)
            run = create.run_create(principal=principal, data=data)
    except ApplicationError as exc:
        error = f"{exc.code}: {exc.message}"
        return FanOutSlot(
            index=index, agent=agent, parent_context=spawn.parent_context, state=SlotState.REPORTED, error=error
        )
    return FanOutSlot(
        index=index, run_id=run.id, agent=agent, parent_context=spawn.parent_context, state=SlotState.STARTED
    )


def _completed(fanout_id: str) -> bool:
    try:
        return FanOut.objects.filter(id=fanout_id, completed_at__isnull=False).exists()
    finally:
        connection.close()


async def batch_await(fanout_id: str, timeout_ms: int) -> bool:
    """Wait (async, no thread held) until the join completes; False at the timeout."""
    bells = hub()
    wake = await bells.subscribe(fanout.fanout_channel(fanout_id))
    completed = sync_to_async(_completed, thread_sensitive=False)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000
    try:
        while not await completed(fanout_id):
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(wake.get(), timeout=min(left, REPOLL_S))
            except TimeoutError:
                continue  # the backstop re-read: a lost ring costs latency only
        return True
    finally:
        await bells.unsubscribe(fanout.fanout_channel(fanout_id), wake)


def batch_cancel_unfinished(*, principal: Principal, fanout_id: str) -> frozenset[str]:
    """At the timeout: cancel every child of the join that has not ended; their run ids."""
    try:
        late = [v.run.id for v in fanout.join_children(fanout_id) if v.run is not None and v.run.status not in TERMINAL]
        for run_id in late:
            run_cancel(principal=principal, run_id=run_id, reason=TIMED_OUT)
        return frozenset(late)
    finally:
        connection.close()


def batch_result(*, fanout_id: str, timed_out: frozenset[str] = frozenset()) -> dict[str, Any]:
    """SPEC 2.3's envelope: `results` index-aligned, `spawned` children made;
    `timed_out` holds the children cancelled at the timeout (batch_cancel_unfinished)."""
    try:
        views = fanout.join_children(fanout_id)
    finally:
        connection.close()
    results = [_entry(v, timed_out) for v in views]
    body: dict[str, Any] = {"results": results, "spawned": sum(v.run is not None for v in views)}
    if timed_out:
        body["timed_out"] = True
    return body


def _entry(v: fanout.ChildView, timed_out: frozenset[str]) -> dict[str, Any]:
    r = v.run
    if r is None:
        return {
            "agent_id": "",
            "run_id": "",
            "session_id": "",
            "status": "failed",
            "stop_reason": "",
            "final_text": "",
            "usage": {},
            "error": v.slot.error,
            "limits": None,
            "parent_context": v.slot.parent_context,
        }
    late = r.id in timed_out
    return {
        "agent_id": r.agent_id,
        "run_id": r.id,
        "session_id": r.session_id,
        "status": r.status,
        "stop_reason": r.stop_reason,
        "final_text": "" if late else v.final_text,
        "usage": r.usage or {},
        "error": f"{TIMED_OUT}; run cancelled" if late else fanout.child_error(r),
        "limits": None,
        "parent_context": v.slot.parent_context,
    }
