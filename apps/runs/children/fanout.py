"""Fan-out with one join: the `Agent` tool's op `parallel_spawn` (SPEC 4.8,
6.4) and the children of `POST /v1/runs:batch` (apps.runs.children.batch).

Invariants:
- The parent parks ONCE for the whole call (a `Park` with status
  `waiting_children`, one pending call). Its children, the `FanOut` join and
  one `FanOutSlot` per entry (index-aligned) are inserted in the parent's
  fenced step commit (`Park.record`), so they exist iff the park commits.
- Every child takes its fairness slot (its tenant's and user's run caps) when the
  call is planned, whether it starts at once or waits: an entry over a cap is
  refused like an unknown agent (`ok: false`, the cap in its error).
- At most `max_concurrent_children` (the parent's agent definition, default 4,
  at most LOOMCYCLE_MAX_CONCURRENT_CHILDREN_CAP) children run at once: the first ones are `queued` and rung after the
  commit, the rest are `waiting_fanout` rows (no worker, no doorbell). Each
  report starts the lowest-index waiting sibling in its own transaction.
- A child's report is exact: the child's compare-and-set
  (`reported_to_parent`), its slot, the join's count, a waiting sibling's
  start and, for the report that completes the join, the parent's answer
  (`apps.runs.wake.run_answer`, ONE tool_result holding the envelope) commit
  together. A report lost to a crash is made by the sweeps (subruns'
  `children_report_sweep` for parallel_spawn children, `batch_report_sweep`
  for batch children, which have no parent run).
- A child's failure is an `ok: false` entry with its `error`; a refused entry
  (unknown agent, depth limit) is one too, and never starts a child.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Subquery
from django.utils import timezone

from apps.core.errors import ApplicationError
from apps.core.ids import is_ident
from apps.core.tools import Park, SpawnRequest, ToolContext, ToolResult
from apps.gateway.providers import ToolCall
from apps.runs import signals, store
from apps.runs.children.spawn import spawn_prepare, spawns_abandon
from apps.runs.create import RunCreate, run_insert
from apps.runs.dispatch import enqueue_iteration
from apps.runs.fanout_models import FanOut, FanOutKind, FanOutSlot, SlotState
from apps.runs.models import TERMINAL, Run, RunStatus, TranscriptEntry
from apps.runs.wake import run_answer

MAX_SPAWNS = 32  # SPEC 4.8: entries per parallel_spawn call, spawns per runs:batch request
DEFAULT_MAX_CONCURRENT = 4  # SPEC 4.8: an agent's `max_concurrent_children` when it sets none
ENTRY_KEYS = frozenset({"name", "prompt", "parent_context"})


def new_fanout_id() -> str:
    """`fo_<16hex ns><8hex>`: time-sortable, as the interrupt ids."""
    return f"fo_{time.time_ns():016x}{secrets.token_hex(4)}"


def fanout_channel(fanout_id: str) -> str:
    """The Redis channel a completed batch join is announced on (apps.core.pubsub)."""
    return f"lc:fanout:{fanout_id}"


class EntryRefused(ValueError):
    """A parallel_spawn input the tool refuses as a whole; the text is the is_error result."""


def parse_entries(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The call's `spawns`, checked: 1..32 objects of {name, prompt, parent_context?}."""
    if "name" in data or "prompt" in data:
        raise EntryRefused("parallel_spawn takes spawns:[{name, prompt}...], not a top-level name/prompt")
    spawns = data.get("spawns")
    if not isinstance(spawns, list) or not 1 <= len(spawns) <= MAX_SPAWNS:
        raise EntryRefused(f"spawns must be a list of 1..{MAX_SPAWNS} entries")
    for i, entry in enumerate(spawns):
        if not isinstance(entry, dict) or set(entry) - ENTRY_KEYS:
            raise EntryRefused(f"spawns[{i}] must be an object with name, prompt and optional parent_context")
        if not isinstance(entry.get("name"), str) or not is_ident(entry["name"]):
            raise EntryRefused(f"spawns[{i}].name must be an agent name ([A-Za-z0-9_-]{{1,128}})")
        if not isinstance(entry.get("prompt"), str) or not entry["prompt"].strip():
            raise EntryRefused(f"spawns[{i}].prompt must be a non-empty string")
        if entry.get("parent_context") is not None and not isinstance(entry["parent_context"], dict):
            raise EntryRefused(f"spawns[{i}].parent_context must be an object")
    return spawns


def max_concurrent_children(definition: dict[str, Any]) -> int:
    """The agent's `max_concurrent_children` (validated a positive int by the substrate), default 4,
    at most LOOMCYCLE_MAX_CONCURRENT_CHILDREN_CAP: a tenant's definition asking for more is refused
    when written (apps.substrate.quotas); a yaml agent's, or a row written under a higher cap, is cut
    to it here."""
    value = definition.get("max_concurrent_children")
    wanted = value if isinstance(value, int) and value > 0 else DEFAULT_MAX_CONCURRENT
    return min(wanted, settings.LOOMCYCLE.max_concurrent_children_cap)


@dataclass(frozen=True)
class Planned:
    """One entry, resolved before any write: a Spawn, or the refusal that replaces it."""

    index: int
    agent: str
    prompt: str
    parent_context: dict[str, Any] | None
    spawn: Any = None  # apps.runs.children.spawn.Spawn
    error: str = ""


@dataclass
class FanOutPark:
    """The parent's one park for a parallel_spawn call (apps.core.tools.Park's two hooks)."""

    ctx: ToolContext
    depth: int
    limit: int
    planned: list[Planned]
    started: list[str] = field(default_factory=list)  # the children rung after the commit

    def record(self, run_id: str, step: int, call_id: str) -> None:
        """Inside the parent's step commit: the children, the join and its slots."""
        self.started = []
        fanout = FanOut(
            id=new_fanout_id(),
            kind=FanOutKind.TOOL,
            tenant_id=self.ctx.tenant_id,
            user_id=self.ctx.user_id,
            parent_run_id=run_id,
            parent_call_id=call_id,
            size=len(self.planned),
            reported=sum(p.spawn is None for p in self.planned),
            max_concurrent=self.limit,
        )
        slots = [self._slot(fanout, p, call_id) for p in self.planned]
        store.fanout_insert(fanout, slots)

    def _slot(self, fanout: FanOut, p: Planned, call_id: str) -> FanOutSlot:
        if p.spawn is None:
            return FanOutSlot(
                fanout=fanout,
                index=p.index,
                agent=p.agent,
                parent_context=p.parent_context,
                state=SlotState.REPORTED,
                error=p.error,
            )
        start = len(self.started) < self.limit
        child_id = _child_insert(self.ctx, p, depth=self.depth, call_id=call_id, start=start)
        signals.send_on_commit(
            signals.run_created,
            run_id=child_id,
            tenant_id=self.ctx.tenant_id,
            user_id=self.ctx.user_id,
            parent_id=self.ctx.run_id,
        )
        if start:
            self.started.append(child_id)
        state = SlotState.STARTED if start else SlotState.WAITING
        return FanOutSlot(
            fanout=fanout, index=p.index, run_id=child_id, agent=p.agent, parent_context=p.parent_context, state=state
        )

    def after_commit(self, run_id: str, call_id: str) -> None:
        """The started children's doorbells (a lost one is re-rung by the stale-run sweep)."""
        for child_id in self.started:
            enqueue_iteration(child_id, 0)

    def abandon(self) -> None:
        """The parent's step dropped this park: no child was inserted; give their fairness slots back."""
        spawns_abandon([p.spawn for p in self.planned if p.spawn is not None], [])


def _child_insert(ctx: ToolContext, p: Planned, *, depth: int, call_id: str, start: bool) -> str:
    from apps.runs.prompt import Segment

    data = RunCreate(
        agent=p.agent,
        segments=[Segment(text=p.prompt)],
        user_id=ctx.user_id,
        parent_id=ctx.run_id,
        tools=p.spawn.caller_tools,
        credentials=p.spawn.credentials,
    )
    status = RunStatus.QUEUED if start else RunStatus.WAITING_FANOUT
    child = run_insert(
        tenant_id=ctx.tenant_id,
        data=data,
        resolved=p.spawn.resolved,
        depth=depth + 1,
        parent_call_id=call_id,
        status=status,
        run_id=p.spawn.run_id or None,  # the id its fairness slot was taken under (subruns.spawn_prepare)
    )
    return child.id


def parallel_spawn_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    """The op: refuse bad input, resolve every entry, then park once (or, when
    every entry was refused, answer at once with the envelope)."""
    try:
        entries = parse_entries(data)
    except EntryRefused as exc:
        return ToolResult(str(exc), is_error=True)
    close_old_connections()
    try:
        return _plan(ctx, entries)
    finally:
        connection.close()


def _plan(ctx: ToolContext, entries: list[dict[str, Any]]) -> ToolResult:
    from apps.substrate.selectors import agent_definition

    depth, routing = Run.objects.filter(id=ctx.run_id).values_list("depth", "routing").get()
    planned = []
    for i, e in enumerate(entries):
        call = ToolCall(id=ctx.call_id, name="Agent", input=e)
        try:
            spawn = spawn_prepare(
                tenant_id=ctx.tenant_id,
                user_id=ctx.user_id,
                depth=depth,
                call=call,
                request=SpawnRequest(agent=e["name"], prompt=e["prompt"]),
                user_tier=(routing or {}).get("user_tier") or None,
                parent_id=ctx.run_id,
                credentials=ctx.credentials,  # inherited as they are: a child never holds more
            )
            planned.append(Planned(i, e["name"], e["prompt"], e.get("parent_context"), spawn=spawn))
        except ApplicationError as exc:
            error = f"cannot spawn {e['name']!r}: {exc.message}"
            planned.append(Planned(i, e["name"], e["prompt"], e.get("parent_context"), error=error))
    if all(p.spawn is None for p in planned):
        return ToolResult(json.dumps({"results": [_refused_entry(p) for p in planned]}))
    limit = max_concurrent_children(agent_definition(ctx.agent_def_id))
    park = FanOutPark(ctx=ctx, depth=depth, limit=limit, planned=planned)
    waiting = Park(
        status=RunStatus.WAITING_CHILDREN, record=park.record, after_commit=park.after_commit, abandon=park.abandon
    )
    return ToolResult("", park=waiting)


def _refused_entry(p: Planned) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": p.index, "agent": p.agent, "ok": False, "error": p.error}
    if p.parent_context is not None:
        entry["parent_context"] = p.parent_context
    return entry


# --- The join: reports, the answer, the sweep.


def fanout_of(child_id: str) -> str | None:
    """The join a child belongs to, None for a child of op=spawn (or any other run)."""
    return FanOutSlot.objects.filter(run_id=child_id).values_list("fanout_id", flat=True).first()


def fanout_child_finished(*, child_id: str, fanout_id: str) -> bool:
    """Count a terminal child in its join, exactly once, and start its next
    waiting sibling; the report that completes the join answers it. False when
    there was nothing to do (already reported, or not terminal)."""
    started: str | None = None
    with transaction.atomic():
        join = store.fanout_lock(fanout_id=fanout_id)  # first: the lock order of apps.runs.store.fanout
        # Compare-and-set: only the first report of this child proceeds.
        if not store.fanout_child_claim(child_id=child_id):
            return False
        counted = store.fanout_count(fanout=join, run_id=child_id)
        if counted is None:
            return False
        if counted.completed:
            _join_answer(counted.fanout)
        elif counted.was_started and _parent_goes_on(counted.fanout):  # a place freed: the next one takes it
            started = store.fanout_start_next(fanout_id=fanout_id)
    if started is not None:
        enqueue_iteration(started, 0)
    return True


def _parent_goes_on(fanout: FanOut) -> bool:
    """Whether waiting children should still start: not once the parent is
    being cancelled (its cancel flags it before it cancels its descendants,
    which finish waiting children on the spot)."""
    if fanout.kind == FanOutKind.BATCH:
        return True
    parent = Run.objects.filter(id=fanout.parent_run_id, cancel_requested=False).exclude(status__in=TERMINAL)
    return parent.exists()


def _join_answer(fanout: FanOut) -> None:
    """Inside the completing report's transaction: the parent's one answer, or the batch's wake-up."""
    if fanout.kind == FanOutKind.BATCH:
        transaction.on_commit(lambda: _announce(fanout.id))
        return
    envelope = {"results": tool_entries(fanout.id)}
    run_answer(
        run_id=fanout.parent_run_id,
        call_id=fanout.parent_call_id,
        tool_name="Agent",
        text=json.dumps(envelope, separators=(",", ":")),
        is_error=False,
    )


def _announce(fanout_id: str) -> None:
    from apps.core.redis import sync_client

    sync_client().publish(fanout_channel(fanout_id), "done")


@dataclass(frozen=True)
class ChildView:
    """A slot with its child's row (None: refused) and final assistant text."""

    slot: FanOutSlot
    run: Run | None
    final_text: str


def join_children(fanout_id: str) -> list[ChildView]:
    """The join's slots in index order, each with its child and final text (three queries)."""
    slots = list(FanOutSlot.objects.filter(fanout_id=fanout_id).order_by("index"))
    ids = [s.run_id for s in slots if s.run_id]
    runs = {r.id: r for r in Run.objects.filter(id__in=ids)}
    texts = final_texts(ids)
    return [ChildView(s, runs.get(s.run_id or ""), texts.get(s.run_id or "", "")) for s in slots]


def final_texts(run_ids: list[str]) -> dict[str, str]:
    """Each run's last assistant turn's text (DISTINCT ON: one row per run)."""
    rows = (
        TranscriptEntry.objects.filter(run_id__in=run_ids, role="assistant")
        .order_by("run_id", "-idx")
        .distinct("run_id")
        .values_list("run_id", "content")
    )
    return {rid: "".join(b.get("text", "") for b in content or [] if b.get("type") == "text") for rid, content in rows}


def child_error(run: Run) -> str:
    """Why a child did not complete ("" when it did)."""
    if run.status == RunStatus.COMPLETED:
        return ""
    return f"{run.status}: {run.error or run.stop_reason or run.status}"


def tool_entries(fanout_id: str) -> list[dict[str, Any]]:
    """SPEC 4.8's envelope entries `{index, agent, ok, output?, error?}`, plus the child's ids."""
    out = []
    for v in join_children(fanout_id):
        entry: dict[str, Any] = {"index": v.slot.index, "agent": v.slot.agent}
        if v.run is None:
            entry.update(ok=False, error=v.slot.error)
        else:
            error = child_error(v.run)
            entry.update(agent_id=v.run.agent_id, run_id=v.run.id, ok=not error)
            entry.update({"error": error} if error else {"output": v.final_text})
        if v.slot.parent_context is not None:
            entry["parent_context"] = v.slot.parent_context
        out.append(entry)
    return out


def batch_report_sweep(*, settle_seconds: float = 2.0) -> int:
    """Batch children that ended but whose report was lost (a crash between
    their commit and the report); parallel_spawn children are swept with every
    other child by apps.runs.children.report.children_report_sweep."""
    cutoff = timezone.now() - timedelta(seconds=settle_seconds)
    started = FanOutSlot.objects.filter(state=SlotState.STARTED, fanout__kind=FanOutKind.BATCH).values("run_id")
    rows = list(
        Run.objects.filter(
            id__in=Subquery(started),
            parent__isnull=True,
            reported_to_parent=False,
            status__in=TERMINAL,
            completed_at__lt=cutoff,
        ).values_list("id", flat=True)[:500]
    )
    reported = 0
    for run_id in rows:
        fanout_id = fanout_of(run_id)
        if fanout_id is not None:
            reported += fanout_child_finished(child_id=run_id, fanout_id=fanout_id)
    return reported


def on_run_finished(run_id: str, status: str) -> None:
    """registry.on_run_finished listener: a batch child (notify_finished) reports to its join."""
    fanout_id = fanout_of(run_id)
    if fanout_id is not None:
        fanout_child_finished(child_id=run_id, fanout_id=fanout_id)
