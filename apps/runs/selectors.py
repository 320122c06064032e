"""Tenant-scoped run reads. Another tenant's run is NotFound, never Forbidden."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, DateTimeField, ExpressionWrapper, F, Q, QuerySet, Value
from django.utils import timezone

from apps.core.errors import Conflict, Invalid, NotFound
from apps.runs.models import (
    PARKED,
    RUNNABLE,
    TERMINAL,
    Interrupt,
    InterruptStatus,
    ResidentChild,
    Run,
    RunEvent,
    RunStatus,
    RuntimeStateValue,
    ToolCallRecord,
    TranscriptEntry,
)
from apps.runs.statuses import ANSWERABLE


def run_get(
    *, tenant_id: str | None, agent_id: str | None = None, run_id: str | None = None, owner: str | None = None
) -> Run:
    """`tenant_id` None reads every tenant (admins: `Principal.read_tenant`);
    `owner` confines an isolated member to its own runs (`Principal.read_user`)."""
    qs = Run.objects.select_related("parent", "resident")  # parent_agent_id, resident: in every response
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    if owner is not None:
        qs = qs.filter(user_id=owner)
    qs = qs.filter(agent_id=agent_id) if agent_id is not None else qs.filter(id=run_id)
    found = list(qs[:2])
    if not found:
        if agent_id is not None:
            raise NotFound(f"unknown agent_id {agent_id}", code="unknown_agent_id")
        raise NotFound(f"unknown run {run_id}", code="not_found")
    if len(found) > 1:  # an agent_id is unique per tenant: only a cross-tenant (admin) read can meet two
        raise Conflict(f"agent_id {agent_id} names runs in several tenants; use the run_id", code="agent_id_ambiguous")
    return found[0]


def runs_for_user(
    *, tenant_id: str | None, user_id: str, status: str = "running", reader: str | None = None
) -> list[Run]:
    """A user's runs. `reader` is an isolated member's own user (SPEC 8): it
    sees no other user's runs."""
    if reader is not None and reader != user_id:
        return []
    qs = Run.objects.select_related("parent", "resident").filter(user_id=user_id).order_by("-created_at")
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    return list(_with_status(qs, status)[:1000])


def _with_status(qs: QuerySet[Run], status: str) -> QuerySet[Run]:
    """`running` = every live state (loomcycle's "running"), `all` = no filter, else a
    comma-separated list of states (`running` in it also meaning every live state)."""
    if status == "running":
        return qs.filter(status__in=[*RUNNABLE, *PARKED])
    if status == "all":
        return qs
    wanted: set[str] = set()
    for item in (s.strip() for s in status.split(",")):
        wanted.update([*RUNNABLE, *PARKED] if item == "running" else [item])
    return qs.filter(status__in=wanted)


def runs_list(
    *, tenant_id: str | None, status: str = "running", agent: str = "", reader: str | None = None
) -> list[Run]:
    """The runs a principal may see, newest first, at most 1000: its tenant's (`tenant_id`
    None: every tenant, for admins), only its own user's for an isolated member (`reader`),
    of one agent name when `agent` is given."""
    qs = Run.objects.select_related("parent", "resident").order_by("-created_at")
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    if reader is not None:
        qs = qs.filter(user_id=reader)
    if agent:
        qs = qs.filter(agent_name=agent)
    return list(_with_status(qs, status)[:1000])


def run_events_since(*, run_id: str, from_seq: int, limit: int = 500) -> list[dict[str, Any]]:
    """The run's events with seq > from_seq, in seq order: seq, step (the iteration that
    appended it), type, payload, created_at, and worker_version (the code version of
    the worker whose iteration appended it; "" for one appended outside an iteration)."""
    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=from_seq).order_by("seq")[:limit]
    return [
        {
            "seq": r.seq,
            "step": r.step,
            "type": r.type,
            "payload": r.payload,
            "created_at": r.created_at,
            "worker_version": r.worker_version,
        }
        for r in rows
    ]


def run_first_announcement_seq(*, run_id: str, upto: int) -> int | None:
    """The seq of the run's first `capability_inert` event up to seq `upto` (apps.runs.inert)."""
    found = RunEvent.objects.filter(run_id=run_id, seq__lte=upto, type="capability_inert").order_by("seq")
    return found.values_list("seq", flat=True).first()


def run_final_text(*, run_id: str) -> str:
    """The text of the run's last assistant turn ("" before it has one)."""
    last = (
        TranscriptEntry.objects.filter(run_id=run_id, role="assistant")
        .order_by("-idx")
        .values_list("content", flat=True)
        .first()
    )
    return "".join(b.get("text", "") for b in last or [] if b.get("type") == "text")


def run_status_seq(*, run_id: str) -> tuple[str, int] | None:
    """The run's status and the seq of its last committed event."""
    row = Run.objects.filter(id=run_id).values_list("status", "last_seq").first()
    return (str(row[0]), int(row[1])) if row is not None else None


def run_status(*, run_id: str) -> str | None:
    return Run.objects.filter(id=run_id).values_list("status", flat=True).first()


def run_status_step(*, run_id: str) -> tuple[str, int] | None:
    """The run's status and step (the iteration in flight or next), or None for no such run."""
    row = Run.objects.filter(id=run_id).values_list("status", "step").first()
    return None if row is None else (row[0], row[1])


def run_statuses(*, run_ids: list[str]) -> dict[str, str]:
    """The status of each run of `run_ids` that exists (one query)."""
    return dict(Run.objects.filter(id__in=run_ids).values_list("id", "status"))


def runnable_runs_count() -> int:
    """Runs of every tenant that a worker may still be moving (`queued`, `running`)."""
    return Run.objects.filter(status__in=RUNNABLE).count()


def live_runs_count() -> int:
    """Runs of every tenant that have not ended (runnable or parked)."""
    return Run.objects.exclude(status__in=TERMINAL).count()


def paused_runs_count() -> int:
    return Run.objects.filter(status=RunStatus.PAUSED).count()


def runs_live_counts() -> dict[str, int]:
    """Live runs of every tenant: `queued` (not claimed yet, or waiting for an admission
    slot) and `active` (every other live state)."""
    rows = Run.objects.filter(status__in=[*RUNNABLE, *PARKED]).values("status").annotate(n=Count("id"))
    by_status = {row["status"]: row["n"] for row in rows}
    queued = by_status.pop(RunStatus.QUEUED, 0) + by_status.pop(RunStatus.WAITING_SLOT, 0)
    return {"active": sum(by_status.values()), "queued": queued}


def runs_live_by_status() -> dict[str, int]:
    """Live (non-terminal) runs of every tenant by status, every live status present
    (0 when none). Terminal runs are not counted here: their table grows without
    bound; `loomcycle_runs_finished_total` counts them (apps.runs.engine.metrics)."""
    rows = Run.objects.filter(status__in=[*RUNNABLE, *PARKED]).values("status").annotate(n=Count("id"))
    counts = {str(s): 0 for s in (*RUNNABLE, *PARKED)}
    counts.update({row["status"]: row["n"] for row in rows})
    return counts


def runs_in_flight_by_tenant(*, limit: int) -> list[tuple[str, int]]:
    """Top-level runs queued or running, per tenant: the `limit` busiest tenants,
    then one ("_other", n) row for the rest when there are more."""
    rows = (
        Run.objects.filter(status__in=RUNNABLE, parent__isnull=True)
        .values("tenant_id")
        .annotate(n=Count("id"))
        .order_by("-n", "tenant_id")
    )
    counted = [(row["tenant_id"], row["n"]) for row in rows]
    top, rest = counted[:limit], counted[limit:]
    if rest:
        top.append(("_other", sum(n for _, n in rest)))
    return top


def runs_liveness(*, run_ids: list[str]) -> dict[str, bool]:
    """{run_id: is live} for the runs that exist; ids with no row are absent."""
    rows = Run.objects.filter(id__in=run_ids).values_list("id", "status")
    return {run_id: status not in TERMINAL for run_id, status in rows}


def run_caller_tools(run_id: str) -> list[str] | None:
    """The tool narrowing the run's creator asked for (None: none), which its sub-agents inherit."""
    found: list[str] | None = Run.objects.filter(id=run_id).values_list("caller_tools", flat=True).first()
    return found


def run_allowed_hosts_of(run_id: str) -> list[str]:
    """The run's effective network hosts, which its sub-agents inherit ([] for an unknown run)."""
    found: list[str] | None = Run.objects.filter(id=run_id).values_list("allowed_hosts", flat=True).first()
    return list(found or [])


def run_routing(*, run_id: str) -> dict[str, Any]:
    """The run's pinned routing ({} for an unknown run): its compaction settings, which sub-agents inherit."""
    found: dict[str, Any] | None = Run.objects.filter(id=run_id).values_list("routing", flat=True).first()
    return dict(found or {})


def runtime_state() -> str:
    """The runtime-wide pause switch (`running` when its row does not exist yet)."""
    with connection.cursor() as cur:  # on every run creation: plain SQL, no ORM compile
        cur.execute("SELECT state FROM runs_runtimestate WHERE id = 1")
        row = cur.fetchone()
    return str(row[0]) if row else RuntimeStateValue.RUNNING


def run_parent_id(*, run_id: str) -> str | None:
    """The run's parent (None: a top-level run, or no such run)."""
    found: str | None = Run.objects.filter(id=run_id).values_list("parent_id", flat=True).first()
    return found


def run_is_answerable(*, run_id: str) -> bool:
    """Whether the run is parked where an answer to a parked call can wake it.
    A check before the answer is computed (a channel wait's answer moves a
    cursor); apps.runs.wake.run_answer re-checks only that the run is not
    terminal, under the run's row lock."""
    return run_status(run_id=run_id) in ANSWERABLE


def run_volumes(*, run_id: str) -> list[dict[str, Any]]:
    """The run's resolved volume bindings (empty: none, or no such run)."""
    found: list[dict[str, Any]] | None = Run.objects.filter(id=run_id).values_list("volumes", flat=True).first()
    return list(found or [])


def runs_live_top_level(*, tenant_id: str | None, agent_name: str, owner: str | None, limit: int) -> list[str]:
    """Ids of live top-level runs of a tenant (None: every tenant) and agent name ("" = any), oldest first."""
    qs = Run.objects.filter(status__in=[*RUNNABLE, *PARKED], parent__isnull=True)
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    if agent_name:
        qs = qs.filter(agent_name=agent_name)
    if owner is not None:
        qs = qs.filter(user_id=owner)
    return list(qs.order_by("created_at").values_list("id", flat=True)[:limit])


def runs_console() -> QuerySet[Run]:
    """Every tenant's runs, newest first, for the operator console (the Django
    admin, which filters, searches and pages this queryset). Only admin
    pages call it: they are the operator plane, gated by Django permissions."""
    return Run.objects.select_related("parent").order_by("-created_at")


def runs_distinct(*, column: str) -> list[str]:
    """The distinct values of `tenant_id` or `agent_name` over all runs, sorted (the console's filters)."""
    if column not in ("tenant_id", "agent_name"):
        raise ValueError(f"no filter on {column}")
    return sorted(Run.objects.order_by().values_list(column, flat=True).distinct())


def run_children(*, run_id: str) -> list[Run]:
    """The run's direct sub-agents, oldest first."""
    return list(Run.objects.filter(parent_id=run_id).order_by("created_at"))


def run_events_all(*, run_id: str, limit: int) -> list[dict[str, Any]]:
    """The run's first `limit` events in seq order (the console's timeline)."""
    return run_events_since(run_id=run_id, from_seq=0, limit=limit)


def run_tool_calls(*, run_id: str) -> list[ToolCallRecord]:
    """The run's tool-call records, in the order they started."""
    return list(ToolCallRecord.objects.filter(run_id=run_id).order_by("step", "started_at", "id"))


# --- Interruptions (SPEC 6.7): a run's interrupts, a user's inbox, what the tool and the sweep need.

INTERRUPT_LIST_CAP = 1000


def _interrupt_statuses(status: str) -> list[str] | None:
    """`?status=`: empty or `all` = every status, else a comma-separated list of them."""
    if status in ("", "all"):
        return None
    wanted = [s.strip() for s in status.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(InterruptStatus.values))
    if unknown:
        raise Invalid(
            f"unknown interrupt status {unknown}; one of {', '.join(InterruptStatus.values)} or all",
            code="invalid_status",
        )
    return wanted


def interrupts_for_run(*, run: Run, status: str = "") -> list[Interrupt]:
    """The interrupts of a run the caller may see (`run` comes from run_get), oldest first."""
    qs = Interrupt.objects.filter(run_id=run.id).order_by("created_at", "id")
    wanted = _interrupt_statuses(status)
    if wanted is not None:
        qs = qs.filter(status__in=wanted)
    return list(qs[:INTERRUPT_LIST_CAP])


def interrupts_for_user(
    *, tenant_id: str | None, user_id: str, status: str = "pending", reader: str | None = None
) -> list[Interrupt]:
    """A user's inbox, newest first: `tenant_id` None reads every tenant (admins); an
    isolated member (`reader`) sees only its own. Pending rows of runs that already
    ended (the sweep cancels them within a period) are left out of `pending`."""
    if reader is not None and reader != user_id:
        return []
    qs = Interrupt.objects.filter(user_id=user_id).order_by("-created_at", "-id")
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    wanted = _interrupt_statuses(status)
    if wanted is not None:
        qs = qs.filter(status__in=wanted)
    if wanted is not None and InterruptStatus.PENDING in wanted:
        qs = qs.exclude(status=InterruptStatus.PENDING, run__status__in=TERMINAL)
    return list(qs[:INTERRUPT_LIST_CAP])


def interrupts_pending_admin() -> QuerySet[Interrupt]:
    """Every pending interrupt of a live run, oldest first (the Django admin's operators see all tenants)."""
    return Interrupt.objects.filter(status=InterruptStatus.PENDING).exclude(run__status__in=TERMINAL)


def interrupt_pending_count(*, run_id: str) -> int:
    return Interrupt.objects.filter(run_id=run_id, status=InterruptStatus.PENDING).count()


def interrupts_due(*, limit: int) -> list[str]:
    """Pending interrupts past their deadline, or whose run already ended; oldest deadline first."""
    now = timezone.now()
    pending = Interrupt.objects.filter(status=InterruptStatus.PENDING)
    due = pending.filter(Q(expires_at__lte=now) | Q(run__status__in=TERMINAL)).order_by("expires_at")
    return list(due.values_list("id", flat=True)[:limit])


@dataclass(frozen=True)
class CancelFlags:
    """A run's status and both cancel flags, as committed now (apps.runs.engine.turncancel)."""

    status: str
    cancel_requested: bool
    cancel_reason: str
    turn_cancel_requested: bool
    turn_cancel_reason: str


def run_cancel_flags(*, run_id: str) -> CancelFlags:
    """The flags the engine reads again when its cancel event fires (no tenant: the engine's own run)."""
    row = Run.objects.filter(id=run_id).values_list(
        "status", "cancel_requested", "cancel_reason", "turn_cancel_requested", "turn_cancel_reason"
    )
    found = row.first()
    if found is None:  # deleted under a live iteration (a tenant erasure): nothing is left to run
        return CancelFlags(RunStatus.CANCELLED, True, "run deleted", False, "")
    return CancelFlags(*found)


def run_transcript_through(*, run_id: str, step: int) -> list[tuple[str, list[dict[str, Any]]]]:
    """The run's transcript rows appended by iterations 0..`step` (apps.runs.fork), in order."""
    rows = TranscriptEntry.objects.filter(run_id=run_id, step__lte=step).order_by("idx")
    return [(r.role, r.content) for r in rows.only("role", "content")]


def run_forks(*, run_id: str, limit: int = 100) -> list[Run]:
    """The runs forked from this one (the admin's run page; no tenant: the admin reads every tenant)."""
    return list(Run.objects.filter(forked_from_run_id=run_id).order_by("created_at")[:limit])


# --- Resident children (apps.runs.children.resident).


def run_spawn_context(*, run_id: str) -> tuple[int, str | None]:
    """A parent's depth and user tier, as a child it spawns inherits them."""
    depth, routing = Run.objects.filter(id=run_id).values_list("depth", "routing").get()
    return int(depth), (routing or {}).get("user_tier") or None


def resident_of(*, parent_id: str, child_id: str) -> ResidentChild | None:
    """The resident row of `child_id` if `parent_id` opened it; None for anyone else's (or no such child)."""
    return ResidentChild.objects.filter(child_id=child_id, parent_id=parent_id).first()


def resident_parent_id(*, child_id: str) -> str | None:
    return ResidentChild.objects.filter(child_id=child_id).values_list("parent_id", flat=True).first()


def resident_open_count(*, parent_id: str) -> int:
    return ResidentChild.objects.filter(parent_id=parent_id, is_open=True).count()


def resident_touching(*, run_id: str) -> tuple[bool, list[str]]:
    """One query: whether `run_id` is a resident child, and the resident children it holds open."""
    rows = ResidentChild.objects.filter(Q(child_id=run_id) | Q(parent_id=run_id, is_open=True))
    found = list(rows.values_list("child_id", "parent_id"))
    return any(c == run_id for c, _ in found), [c for c, p in found if p == run_id]


def resident_child_run(*, child_id: str) -> tuple[str, int]:
    """The child run's status and how many inputs it has not consumed yet."""
    status, pending = Run.objects.filter(id=child_id).values_list("status", "pending_inputs").get()
    return str(status), int(pending)


def resident_output(*, child_id: str, since: int) -> tuple[list[str], int]:
    """The text of each assistant message the child added at transcript index `since` or
    later, and the index to read from next time (past the last of them)."""
    rows = TranscriptEntry.objects.filter(run_id=child_id, idx__gte=since, role="assistant").order_by("idx")
    texts, next_idx = [], since
    for idx, content in rows.values_list("idx", "content"):
        text = "".join(str(b.get("text", "")) for b in content or [] if b.get("type") == "text")
        if text:
            texts.append(text)
        next_idx = idx + 1
    return texts, next_idx


def resident_idle_due(*, now: datetime, limit: int) -> list[tuple[str, str]]:
    """(child, parent) of open rows parked idle (no waiting call) past their idle TTL at `now`."""
    deadline = ExpressionWrapper(
        Value(now) - F("idle_ttl_seconds") * Value(timedelta(seconds=1)), output_field=DateTimeField()
    )
    rows = ResidentChild.objects.filter(
        is_open=True, waiter_call_id="", child__status=RunStatus.AWAITING_INPUT, last_used_at__lt=deadline
    )
    return [(str(c), str(p)) for c, p in rows.values_list("child_id", "parent_id")[:limit]]


def resident_ended_due(*, limit: int) -> list[tuple[str, str]]:
    """(child, parent) of open rows whose parent or child run ended (their close was lost)."""
    rows = ResidentChild.objects.filter(Q(parent__status__in=TERMINAL) | Q(child__status__in=TERMINAL), is_open=True)
    return [(str(c), str(p)) for c, p in rows.values_list("child_id", "parent_id")[:limit]]


def resident_closed_live(*, limit: int) -> list[tuple[str, str]]:
    """(child, close reason) of closed rows whose child run is not terminal (its stop was lost)."""
    rows = ResidentChild.objects.filter(is_open=False).exclude(child__status__in=TERMINAL)
    return [(str(c), str(r)) for c, r in rows.values_list("child_id", "close_reason")[:limit]]


def resident_waiting_due(*, now: datetime, limit: int) -> list[str]:
    """Children a parent's call waits on whose turn is over, or whose wait timed out (a lost or due report)."""
    over = (
        Q(is_open=False)
        | Q(child__status__in=TERMINAL)
        | Q(child__status=RunStatus.AWAITING_INPUT, child__pending_inputs=0)
        | Q(waiter_until__lt=now)
    )
    rows = ResidentChild.objects.filter(over).exclude(waiter_call_id="")
    return [str(c) for c in rows.values_list("child_id", flat=True)[:limit]]


def runs_orphaned(*, limit: int) -> list[str]:
    """Up to `limit` live runs whose parent run has ended (one query): nobody waits for them.
    A run whose cancel is already requested is not one: the cascade flagged it and its lease
    holder (or, if that worker died, the next claim) finishes it with the cascade's reason."""
    rows = (
        Run.objects.filter(parent__status__in=TERMINAL, cancel_requested=False)
        .exclude(status__in=TERMINAL)
        .order_by("created_at")
    )
    return [str(i) for i in rows.values_list("id", flat=True)[:limit]]


@dataclass(frozen=True)
class SessionRun:
    id: str
    status: str
    turn: int


def session_runs(*, tenant_id: str, user_id: str, session_id: str) -> list[SessionRun]:
    """The session's top-level runs of this owner, in turn order ([] when it has none):
    what a new run's placement in its session reads (apps.runs.backpressure.session_place)."""
    qs = Run.objects.filter(session_id=session_id, parent__isnull=True, tenant_id=tenant_id, user_id=user_id)
    return [
        SessionRun(i, s, t) for i, s, t in qs.order_by("session_turn", "id").values_list("id", "status", "session_turn")
    ]


def session_has_image(*, tenant_id: str, session_id: str) -> bool:
    """Whether a transcript row of the history a continuation replays holds an image (a JSONB
    containment test; a row a compaction left out counts too, which errs on refusing)."""
    return bool(
        TranscriptEntry.objects.filter(
            run__session_id=session_id,
            run__tenant_id=tenant_id,
            run__parent__isnull=True,
            run__session_rolled_back=False,
            content__contains=[{"type": "image"}],
        ).exists()
    )


def run_agent_names(*, run_ids: list[str]) -> dict[str, str]:
    """{run_id: agent name}: the usage report's agent grouping (apps.budgets.selectors)."""
    return {str(i): str(a) for i, a in Run.objects.filter(id__in=run_ids).values_list("id", "agent_name")}
