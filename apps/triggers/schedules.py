"""Firing ScheduleDefs (SPEC 9.1): the tick beat sends every
`LOOMCYCLE_SCHEDULER_TICK_SECONDS`, run on a worker.

Invariants:
- only the active, unretired version of a (tenant, name) fires; its state row
  is seeded (next slot after the moment it is first seen) by the first tick
  that sees it;
- a tick claims one due state row at a time with FOR UPDATE SKIP LOCKED and
  fires it in ONE transaction: the fire rows, their runs (and on_complete
  jobs), the state's advance and an auto-retire commit together or not at
  all. Overlapping ticks share the due rows; a tick killed mid-way rolls
  back and the next tick fires the same slots;
- a fire row is UNIQUE per (schedule name, def version, fire time) and is
  inserted before its run in the same transaction: the backstop that makes
  a slot fire at most once even if two transactions computed it;
- slots are cron slots (deterministic), so hosts whose clocks differ agree
  on the key; a clock only decides how soon a slot is seen as due;
- the whole tick is skipped while the runtime is not running.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.core.errors import ApplicationError, QuotaExhausted, RuntimePaused
from apps.core.identity import ACT_AS_USER_SCOPE
from apps.core.types import TENANT_SCOPE, Principal
from apps.runs.models import RuntimeStateValue
from apps.runs.prompt import Segment
from apps.runs.selectors import runtime_state
from apps.runs.services import RunCreate, run_create
from apps.substrate.kinds import get_kind
from apps.substrate.models import ScheduleDef
from apps.substrate.selectors import active_defs
from apps.substrate.services import def_retire_auto
from apps.triggers.cron import cron_of, due_slots, next_after
from apps.triggers.models import FireOutcome, ScheduleFire, ScheduleState
from apps.triggers.oncomplete import oncomplete_record

log = logging.getLogger("loomcycle.triggers")

RUNNING_STATUS = "running"  # last_status of a fire whose run has not ended yet
UNKNOWN_AGENT = "unknown_agent"
PARK_FOR = timedelta(hours=1)  # a definition whose fire times cannot be computed is looked at again then


@dataclass(frozen=True)
class TickResult:
    paused: bool = False  # the runtime was not running: nothing was looked at
    seeded: int = 0  # state rows created for newly active versions
    schedules: int = 0  # schedules whose due slots this tick handled
    fires: int = 0  # fire rows written (runs, failures, skips)
    dropped: int = 0  # due slots beyond catch_up_max, not fired


def schedules_tick(*, now: datetime | None = None, budget_s: float = 60.0) -> TickResult:
    """Fire every schedule due at `now` (default: this host's clock) that no
    concurrent tick holds, until none is left or `budget_s` has passed."""
    if runtime_state() != RuntimeStateValue.RUNNING:
        return TickResult(paused=True)
    now = now or timezone.now()
    seeded = schedule_states_seed(now=now)
    deadline = time.monotonic() + budget_s
    handled: list[str] = []
    fires = dropped = 0
    while time.monotonic() < deadline:
        try:
            done = _fire_next(now=now, exclude=handled)
        except RuntimePaused:
            break  # paused mid-tick: that schedule's transaction rolled back; the next tick fires it
        if done is None:
            break
        handled.append(done.def_id)
        fires, dropped = fires + done.fires, dropped + done.dropped
    return TickResult(seeded=seeded, schedules=len(handled), fires=fires, dropped=dropped)


def schedule_states_seed(*, now: datetime) -> int:
    """A state row for each active version that has none: next_run_at = its first slot after `now`."""
    missing = active_defs(get_kind("schedule")).filter(~Q(id__in=ScheduleState.objects.values("schedule_def_id")))
    rows = [_new_state(row, now) for row in missing if isinstance(row, ScheduleDef)]
    ScheduleState.objects.bulk_create(rows, ignore_conflicts=True)  # a concurrent tick may seed the same rows
    return len(rows)


def _new_state(row: ScheduleDef, now: datetime) -> ScheduleState:
    d = row.definition
    return ScheduleState(
        schedule_def=row,
        tenant_id=row.tenant_id,
        name=row.name,
        next_run_at=next_after(cron_of(d), str(d.get("timezone") or "UTC"), now),
    )


@dataclass(frozen=True)
class _Handled:
    def_id: str
    fires: int
    dropped: int


def _fire_next(*, now: datetime, exclude: list[str]) -> _Handled | None:
    with transaction.atomic():
        state = _claim_due(now, exclude)
        if state is None:
            return None
        try:
            plan = _plan(state, now)
        except (KeyError, ValueError, TypeError) as exc:  # a definition the cron code cannot read: park 1 h
            log.error("schedule %s (%s): cannot compute its fire times: %r", state.name, state.schedule_def_id, exc)
            _park(state, now, f"decode_def: {exc!r}")
            return _Handled(state.schedule_def_id, 0, 0)
        fires = _fire_schedule(state, plan)
    return _Handled(state.schedule_def_id, fires, plan.dropped)


def _claim_due(now: datetime, exclude: list[str]) -> ScheduleState | None:
    # SKIP LOCKED: a row another tick is firing is skipped, not waited for; it commits
    # its advance, so this tick never sees that slot as due again.
    found: ScheduleState | None = (
        ScheduleState.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("schedule_def")
        .filter(next_run_at__lte=now, schedule_def_id__in=active_defs(get_kind("schedule")).values("id"))
        .filter(Q(paused_until__isnull=True) | Q(paused_until__lte=now))
        .exclude(schedule_def_id__in=exclude)
        .order_by("next_run_at")
        .first()
    )
    return found


def _park(state: ScheduleState, now: datetime, error: str) -> None:
    state.next_run_at = now + PARK_FOR
    state.last_status, state.last_error = "failed", error
    state.save()


@dataclass(frozen=True)
class _Plan:
    slots: list[datetime]  # to fire, oldest first
    dropped: int  # due slots beyond catch_up_max
    next_run_at: datetime | None
    max_fires: int


def _plan(state: ScheduleState, now: datetime) -> _Plan:
    """What a claimed state row fires now; raises on a definition it cannot read."""
    d = state.schedule_def.definition
    expr, tz = cron_of(d), str(d.get("timezone") or "UTC")
    assert state.next_run_at is not None  # the claim filtered on it
    keep = int(d.get("catch_up_max") or 0) + 1
    slots, dropped = due_slots(expr, tz, first=state.next_run_at, now=now, keep=keep)
    return _Plan(slots, dropped, next_after(expr, tz, now), int(d.get("max_fires") or 0))


def _fire_schedule(state: ScheduleState, plan: _Plan) -> int:
    """Fire the planned slots of a claimed state row, advance it, retire a def
    that reached max_fires. In the caller's transaction. -> fire rows written."""
    row: ScheduleDef = state.schedule_def
    if plan.dropped:
        log.info("schedule %s: %d missed slot(s) beyond catch_up_max not fired", row.name, plan.dropped)
    fires = 0
    for slot in plan.slots:
        if plan.max_fires and state.fire_count >= plan.max_fires:
            break
        fire = _fire_slot(row, slot)
        if fire is None:
            continue  # already fired (the UNIQUE backstop)
        fires += 1
        _record(state, fire)
    state.next_run_at = plan.next_run_at
    if plan.max_fires and state.fire_count >= plan.max_fires:
        def_retire_auto(get_kind("schedule"), def_id=row.id)
        state.next_run_at = None
        log.info("schedule %s: max_fires %d reached, definition %s retired", row.name, plan.max_fires, row.id)
    state.save()
    return fires


def _record(state: ScheduleState, fire: ScheduleFire) -> None:
    state.last_run_at = fire.fire_time
    state.last_error = fire.error
    state.last_status = RUNNING_STATUS if fire.outcome == FireOutcome.STARTED else fire.outcome
    if fire.run_id:
        state.last_run_id = fire.run_id
    state.fire_count += int(fire.counted)


def _fire_slot(row: ScheduleDef, slot: datetime) -> ScheduleFire | None:
    """One fire row (and its run): None when the slot has a fire row already."""
    d = row.definition
    enabled = d.get("enabled", True) is not False
    try:
        with transaction.atomic():  # savepoint: a duplicate leaves the tick's transaction usable
            fire = ScheduleFire.objects.create(
                schedule_name=row.name,
                schedule_def=row,
                tenant_id=row.tenant_id,
                fire_time=slot,
                outcome=FireOutcome.STARTED if enabled else FireOutcome.SKIPPED_DISABLED,
            )
    except IntegrityError:
        return None
    if enabled:
        _start_run(row, fire)
    return fire


def _start_run(row: ScheduleDef, fire: ScheduleFire) -> None:
    """The fire's run, created in the fire row's transaction; refusals become the fire's outcome."""
    d = row.definition
    try:
        with transaction.atomic():
            run = run_create(principal=schedule_principal(row), data=schedule_run_input(row, fire.fire_time))
            hooks = list(d.get("on_complete") or [])
            oncomplete_record(
                run_id=run.id,
                tenant_id=row.tenant_id,
                user_id=run.user_id,
                agent_id=run.agent_id,
                agent_name=run.agent_name,
                hooks=hooks,
                origin={"schedule_name": row.name},
                agent_scope_id=row.name,
            )
    except RuntimePaused:
        raise
    except QuotaExhausted as exc:
        fire.outcome, fire.error = FireOutcome.SKIPPED, f"{exc.code}: {exc.message}"
    except ApplicationError as exc:  # unknown agent, unroutable model...: no run
        fire.outcome, fire.error = FireOutcome.FAILED, f"{exc.code}: {exc.message}"
        fire.counted = exc.code != UNKNOWN_AGENT  # SPEC 9.1: an unknown agent does not count
    else:
        fire.run_id, fire.counted = run.id, True
    fire.save(update_fields=["outcome", "error", "counted", "run_id"])


def schedule_principal(row: ScheduleDef) -> Principal:
    """Who a schedule's run is created as: the def's tenant (never anything
    else), naming the def's user_id."""
    return Principal(
        tenant_id=row.tenant_id, subject=f"schedule:{row.name}", scopes=frozenset({TENANT_SCOPE, ACT_AS_USER_SCOPE})
    )


def schedule_run_input(row: ScheduleDef, slot: datetime) -> RunCreate:
    d = row.definition
    return RunCreate(
        agent=str(d["agent"]),
        segments=prompt_segments(d.get("prompt"), row.name, slot),
        user_id=str(d.get("user_id") or ""),
        metadata=d.get("metadata") or None,
        user_tier=d.get("user_tier") or None,
        tenant_id=row.tenant_id,
        notify_finished=True,
    )


def prompt_segments(prompt: Any, name: str, slot: datetime) -> list[Segment]:
    """A ScheduleDef prompt (validated by apps.substrate.kinds_admin.schedule)
    as run segments: text is trusted, `untrusted-block` keeps its kind. No
    prompt: one line naming the schedule and the slot."""
    if not prompt:
        return [Segment(text=f"Scheduled run of {name!r} for {slot.astimezone(UTC).isoformat()}.")]
    if isinstance(prompt, str):
        return [Segment(text=prompt)]
    out = []
    for message in prompt:
        for block in message["content"]:
            untrusted = block["type"] == "untrusted-block"
            out.append(
                Segment(
                    role=message["role"],
                    type="untrusted-block" if untrusted else "trusted-text",
                    text=block["text"],
                    kind=block.get("kind") or "untrusted",
                )
            )
    return out
