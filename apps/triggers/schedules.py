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

from django.db import connection, transaction
from django.db.models import Q, QuerySet
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
    schedules = fires = dropped = 0
    while time.monotonic() < deadline:
        try:
            batch = _fire_batch(now=now)
        except RuntimePaused:
            break  # paused mid-tick: the batch's transaction rolled back; the next tick fires it
        if not batch:
            break
        schedules += len(batch)
        fires, dropped = fires + sum(h.fires for h in batch), dropped + sum(h.dropped for h in batch)
    return TickResult(seeded=seeded, schedules=schedules, fires=fires, dropped=dropped)


HELPERS_MAX = 8  # extra ticks a tick may start when many schedules are due at once


def tick_helpers_wanted(*, now: datetime | None = None) -> int:
    """How many helper ticks to start beside this one: one per CLAIM_BATCH due
    rows beyond the first batch (at most HELPERS_MAX). Helpers run the same
    tick; SKIP LOCKED shares the due rows between them."""
    now = now or timezone.now()
    due = _due(now).count()
    return min(HELPERS_MAX, max(0, due - 1) // CLAIM_BATCH)


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


CLAIM_BATCH = 20  # due rows claimed per transaction: one commit (a WAL flush) per batch, not per schedule


def _fire_batch(*, now: datetime) -> list[_Handled]:
    with transaction.atomic():
        return [_fire_claimed(state, now) for state in _claim_due(now, CLAIM_BATCH)]


def _fire_claimed(state: ScheduleState, now: datetime) -> _Handled:
    """One claimed schedule, in a savepoint: a schedule that cannot be fired is
    parked for an hour (SPEC 9.1) instead of failing the rest of the batch."""
    try:
        plan = _plan(state, now)
    except (KeyError, ValueError, TypeError) as exc:  # a definition the cron code cannot read
        log.error("schedule %s (%s): cannot compute its fire times: %r", state.name, state.schedule_def_id, exc)
        _park(state, now, f"decode_def: {exc!r}")
        return _Handled(state.schedule_def_id, 0, 0)
    try:
        with transaction.atomic():
            fires = _fire_schedule(state, plan)
    except RuntimePaused:
        raise
    except Exception as exc:  # logged with its traceback and recorded on the state; the others still fire
        log.exception("schedule %s (%s): firing failed; parked for an hour", state.name, state.schedule_def_id)
        _park(state, now, f"fire failed: {exc!r}")
        return _Handled(state.schedule_def_id, 0, 0)
    return _Handled(state.schedule_def_id, fires, plan.dropped)


def _claim_due(now: datetime, limit: int) -> list[ScheduleState]:
    # SKIP LOCKED: rows another tick is firing are skipped, not waited for; it commits
    # their advance, so this tick never sees those slots as due again.
    due = _due(now).select_for_update(skip_locked=True, of=("self",)).select_related("schedule_def")
    return list(due.order_by("next_run_at")[:limit])


def _due(now: datetime) -> QuerySet[ScheduleState]:
    """State rows of active, unretired versions, due at `now` and not paused."""
    return ScheduleState.objects.filter(
        next_run_at__lte=now, schedule_def_id__in=active_defs(get_kind("schedule")).values("id")
    ).filter(Q(paused_until__isnull=True) | Q(paused_until__lte=now))


def _park(state: ScheduleState, now: datetime, error: str) -> None:
    ScheduleState.objects.filter(pk=state.pk).update(
        next_run_at=now + PARK_FOR, last_status=FireOutcome.FAILED, last_error=error, updated_at=timezone.now()
    )


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


_FIRE_INSERT = f"""
INSERT INTO {ScheduleFire._meta.db_table}
  (schedule_name, schedule_def_id, tenant_id, fire_time, fired_at, outcome, counted, run_id, error, run_status)
VALUES (%s, %s, %s, %s, now(), %s, false, '', '', '')
ON CONFLICT ON CONSTRAINT schedulefire_slot DO NOTHING
RETURNING id
"""


def _fire_slot(row: ScheduleDef, slot: datetime) -> ScheduleFire | None:
    """One fire row (and its run): None when the slot has a fire row already."""
    enabled = row.definition.get("enabled", True) is not False
    outcome = FireOutcome.STARTED if enabled else FireOutcome.SKIPPED_DISABLED
    with connection.cursor() as cur:  # the UNIQUE slot key: a second insert of a slot inserts nothing
        cur.execute(_FIRE_INSERT, [row.name, row.id, row.tenant_id, slot, outcome])
        inserted = cur.fetchone()
    if inserted is None:
        return None
    fire = ScheduleFire(
        id=inserted[0],
        schedule_name=row.name,
        schedule_def=row,
        tenant_id=row.tenant_id,
        fire_time=slot,
        outcome=outcome,
    )
    fire._state.adding = False
    if enabled:
        _start_run(row, fire)
    return fire


def _start_run(row: ScheduleDef, fire: ScheduleFire) -> None:
    """The fire's run, created in the fire row's transaction; refusals become the fire's outcome."""
    d = row.definition
    try:
        # No savepoint of our own: run_create raises its refusals before it writes,
        # and wraps its insert in one (a duplicate agent_id).
        run = run_create(principal=schedule_principal(row), data=schedule_run_input(row, fire.fire_time))
        oncomplete_record(
            run_id=run.id,
            tenant_id=row.tenant_id,
            user_id=run.user_id,
            agent_id=run.agent_id,
            agent_name=run.agent_name,
            hooks=list(d.get("on_complete") or []),
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
