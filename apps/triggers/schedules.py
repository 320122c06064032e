"""Firing ScheduleDefs (SPEC 9.1): the tick beat sends every
`LOOMCYCLE_SCHEDULER_TICK_SECONDS`, run on a worker.

Invariants:
- only the active, unretired version of a (tenant, name) fires; its state row
  is seeded by the first tick that sees it (or an admin verb): next_run_at =
  the first slot at or after its activation (promoted_at, else created_at;
  at most `now`) or after the previous version's unfired next_run_at, if
  earlier, and the previous version's pause carries over. Becoming active
  again (promote, un-retire) re-seeds it (the `version_activated` receiver);
- a tick claims one due state row at a time with FOR UPDATE SKIP LOCKED and
  fires it in ONE transaction: the fire rows, their runs (and on_complete
  jobs), the state's advance and an auto-retire commit together or not at
  all. Overlapping ticks share the due rows; a tick killed mid-way rolls
  back and the next tick fires the same slots;
- a fire row is UNIQUE per (tenant, schedule name, fire time), whatever the
  version, and is inserted before its run in the same transaction: the
  backstop that makes a slot fire at most once even if two transactions (or
  two versions, after a rollback) computed it;
- a brief infrastructure failure (a 503-class error, Redis down) rolls the
  schedule's savepoint back: nothing recorded or counted, the next tick
  retries the same slots;
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

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from redis.exceptions import RedisError

from apps.core.errors import ApplicationError, Invalid, QuotaExhausted, RuntimePaused
from apps.core.identity import ACT_AS_USER_SCOPE
from apps.core.metrics import count_on_commit
from apps.core.scopes import TENANT
from apps.core.types import Principal
from apps.runs.models import RuntimeStateValue
from apps.runs.prompt import Segment, parse_segments
from apps.runs.selectors import runtime_state
from apps.runs.services import RunCreate, run_create
from apps.substrate.kinds import get_kind
from apps.substrate.models import ScheduleDef
from apps.substrate.selectors import active_defs
from apps.substrate.services import def_retire_auto
from apps.triggers.credentials import CredentialMissing, schedule_credentials
from apps.triggers.cron import DROPPED_COUNT_CAP, cron_of, due_slots, next_after
from apps.triggers.metrics import SCHEDULE_FIRES
from apps.triggers.models import FireOutcome, ScheduleFire, SchedulerTick, ScheduleState
from apps.triggers.oncomplete import oncomplete_record

log = logging.getLogger("loomcycle.triggers")

RUNNING_STATUS = "running"  # last_status of a fire whose run has not ended yet
UNKNOWN_AGENT = "unknown_agent"
PARK_FOR = timedelta(hours=1)  # a definition whose fire times cannot be computed is looked at again then
LATE_TICK_MIN_WINDOW = timedelta(minutes=2)  # see late_tick_window


def late_tick_window() -> timedelta:
    """A previous complete tick at most this old (4 tick intervals, at least 2
    minutes) means this tick is merely late: every slot due since it fires.
    An older one means the scheduler was down: catch_up_max applies."""
    return max(LATE_TICK_MIN_WINDOW, 4 * timedelta(seconds=settings.LOOMCYCLE.scheduler_tick_seconds))


PROMPT_REFUSED = "prompt_invalid"
CREDENTIALS_MISSING = "credentials_unresolvable"


class InfraUnavailable(Exception):
    """A brief infrastructure failure while firing: retry the slot next tick."""


def _is_infra(exc: BaseException) -> bool:
    """503-class refusals (fairness stats unavailable, ...) and Redis errors: transient, not the schedule's fault."""
    if isinstance(exc, RuntimePaused):
        return False
    return isinstance(exc, RedisError) or (isinstance(exc, ApplicationError) and exc.status >= 500)


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
    if runtime_paused():
        return TickResult(paused=True)
    now = now or timezone.now()
    seeded = schedule_states_seed(now=now)
    protect_after = _previous_tick(now)
    deadline = time.monotonic() + budget_s
    schedules = fires = dropped = 0
    retry: set[str] = set()  # schedules an infrastructure failure sent to the next tick
    finished = False
    while time.monotonic() < deadline:
        try:
            batch = _fire_batch(now=now, protect_after=protect_after, exclude=retry)
        except RuntimePaused:
            break  # paused mid-tick: the batch's transaction rolled back; the next tick fires it
        if not batch:
            finished = True
            break
        retry |= {h.def_id for h in batch if h.retry}
        schedules += len(batch)
        fires, dropped = fires + sum(h.fires for h in batch), dropped + sum(h.dropped for h in batch)
    if finished and not retry:
        _tick_done(now)
    return TickResult(seeded=seeded, schedules=schedules, fires=fires, dropped=dropped)


def _previous_tick(now: datetime) -> datetime | None:
    """When the last complete tick ran, if recent: slots after it fired late,
    not missed in an outage, so catch_up_max does not drop them."""
    last = SchedulerTick.objects.filter(id=1).values_list("last_tick_at", flat=True).first()
    if last is None or not now - late_tick_window() <= last <= now:
        return None
    return last


def _tick_done(now: datetime) -> None:
    SchedulerTick.objects.filter(id=1, last_tick_at__lt=now).update(last_tick_at=now)
    SchedulerTick.objects.get_or_create(id=1, defaults={"last_tick_at": now})


def runtime_paused() -> bool:
    """The runtime is not running (paused or pausing): no tick fires, no helper starts."""
    return runtime_state() != RuntimeStateValue.RUNNING


HELPERS_MAX = 8  # extra ticks a tick may start when many schedules are due at once


def tick_helpers_wanted(*, now: datetime | None = None) -> int:
    """How many helper ticks to start beside this one: one per CLAIM_BATCH due
    rows beyond the first batch (at most HELPERS_MAX). Helpers run the same
    tick; SKIP LOCKED shares the due rows between them."""
    now = now or timezone.now()
    due = _due(now).count()
    return min(HELPERS_MAX, max(0, due - 1) // CLAIM_BATCH)


def schedule_states_seed(*, now: datetime) -> int:
    """A state row for each active version that has none (see new_state)."""
    kind = get_kind("schedule")
    missing = active_defs(kind).filter(~Q(id__in=ScheduleState.objects.values("schedule_def_id")))
    promoted = dict(
        kind.pointer._default_manager.filter(active_def_id__in=missing.values("id")).values_list(
            "active_def_id", "promoted_at"
        )
    )
    rows = [
        new_state(row, promoted.get(row.id) or row.created_at, now) for row in missing if isinstance(row, ScheduleDef)
    ]
    ScheduleState.objects.bulk_create(rows, ignore_conflicts=True)  # a concurrent tick may seed the same rows
    return len(rows)


def new_state(row: ScheduleDef, activated: datetime, now: datetime) -> ScheduleState:
    """The state of a version that has none: next_run_at = its first slot at or
    after its activation (at most `now`), or after the previous version's
    unfired next_run_at if that is earlier (unless it is retired); the previous
    version's pause. The
    previous version is the most recently touched state of the same (tenant,
    name) (the activation receiver touches it)."""
    previous = (
        ScheduleState.objects.filter(tenant_id=row.tenant_id, name=row.name)
        .exclude(schedule_def_id=row.id)
        .select_related("schedule_def")
        .order_by("-updated_at")
        .first()
    )
    start = min(activated, now)
    # A retired previous version stopped firing: it has no unfired slot to hand on.
    if previous is not None and previous.next_run_at is not None and not previous.schedule_def.retired:
        start = min(start, previous.next_run_at)
    d = row.definition
    return ScheduleState(
        schedule_def=row,
        tenant_id=row.tenant_id,
        name=row.name,
        next_run_at=next_after(cron_of(d), str(d.get("timezone") or "UTC"), start - _JUST_BEFORE),
        paused_until=previous.paused_until if previous is not None else None,
    )


_JUST_BEFORE = timedelta(microseconds=1)  # next_after is strictly after: a slot at the activation instant fires


def schedule_version_activated(*, def_id: str, previous_def_id: str | None, at: datetime) -> None:
    """substrate's version_activated for ScheduleDefs, in the activating
    transaction. Promoting another version: the previous one's state is
    touched (the one a new state inherits from) and this version's stale
    state, if any (a rollback), is dropped, so the next tick re-seeds it from
    the previous version's next slot and pause. Un-retiring the active
    version: its count restarts and, if it had no next slot, it gets one."""
    if previous_def_id is not None and previous_def_id != def_id:
        ScheduleState.objects.filter(schedule_def_id=previous_def_id).update(updated_at=at)
        ScheduleState.objects.filter(schedule_def_id=def_id).delete()
        return
    state = (
        ScheduleState.objects.select_for_update().filter(schedule_def_id=def_id).select_related("schedule_def").first()
    )
    if state is None:
        return
    state.fire_count = 0
    if state.next_run_at is None:
        d = state.schedule_def.definition
        state.next_run_at = next_after(cron_of(d), str(d.get("timezone") or "UTC"), at)
    state.save(update_fields=["fire_count", "next_run_at", "updated_at"])


@dataclass(frozen=True)
class _Handled:
    def_id: str
    fires: int
    dropped: int
    retry: bool = False  # an infrastructure failure: rolled back, the next tick fires it


CLAIM_BATCH = 20  # due rows claimed per transaction: one commit (a WAL flush) per batch, not per schedule


def _fire_batch(*, now: datetime, protect_after: datetime | None, exclude: set[str]) -> list[_Handled]:
    with transaction.atomic():
        return [_fire_claimed(state, now, protect_after) for state in _claim_due(now, CLAIM_BATCH, exclude)]


def _fire_claimed(state: ScheduleState, now: datetime, protect_after: datetime | None = None) -> _Handled:
    """One claimed schedule, in a savepoint: a schedule that cannot be fired is
    parked for an hour (SPEC 9.1) instead of failing the rest of the batch."""
    try:
        plan = _plan(state, now, protect_after)
    except (KeyError, ValueError, TypeError) as exc:  # a definition the cron code cannot read
        log.error("schedule %s (%s): cannot compute its fire times: %r", state.name, state.schedule_def_id, exc)
        _park(state, now, f"decode_def: {exc!r}")
        return _Handled(state.schedule_def_id, 0, 0)
    try:
        with transaction.atomic():
            fires = _fire_schedule(state, plan)
    except RuntimePaused:
        raise
    except (InfraUnavailable, RedisError) as exc:  # the savepoint rolled back: nothing recorded or counted
        log.warning(
            "schedule %s (%s): infrastructure unavailable, retried next tick: %s",
            state.name,
            state.schedule_def_id,
            exc,
        )
        return _Handled(state.schedule_def_id, 0, 0, retry=True)
    except Exception as exc:  # logged with its traceback and recorded on the state; the others still fire
        log.exception("schedule %s (%s): firing failed; parked for an hour", state.name, state.schedule_def_id)
        _park(state, now, f"fire failed: {exc!r}")
        return _Handled(state.schedule_def_id, 0, 0)
    return _Handled(state.schedule_def_id, fires, plan.dropped)


def _claim_due(now: datetime, limit: int, exclude: set[str] | None = None) -> list[ScheduleState]:
    # SKIP LOCKED: rows another tick is firing are skipped, not waited for; it commits
    # their advance, so this tick never sees those slots as due again.
    due = _due(now).select_for_update(skip_locked=True, of=("self",)).select_related("schedule_def")
    if exclude:
        due = due.exclude(schedule_def_id__in=exclude)
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


def _plan(state: ScheduleState, now: datetime, protect_after: datetime | None = None) -> _Plan:
    """What a claimed state row fires now; raises on a definition it cannot read."""
    d = state.schedule_def.definition
    expr, tz = cron_of(d), str(d.get("timezone") or "UTC")
    assert state.next_run_at is not None  # the claim filtered on it
    keep = int(d.get("catch_up_max") or 0) + 1
    slots, dropped = due_slots(expr, tz, first=state.next_run_at, now=now, keep=keep, protect_after=protect_after)
    return _Plan(slots, dropped, next_after(expr, tz, now), int(d.get("max_fires") or 0))


def _fire_schedule(state: ScheduleState, plan: _Plan) -> int:
    """Fire the planned slots of a claimed state row, advance it, retire a def
    that reached max_fires. In the caller's transaction. -> fire rows written."""
    row: ScheduleDef = state.schedule_def
    if plan.dropped:
        at_least = "at least " if plan.dropped >= DROPPED_COUNT_CAP else ""
        log.info("schedule %s: %s%d missed slot(s) beyond catch_up_max not fired", row.name, at_least, plan.dropped)
    fires = 0
    for slot in plan.slots:
        if plan.max_fires and state.fire_count >= plan.max_fires:
            break
        fire = _fire_slot(row, slot)
        if fire is None:
            continue  # already fired (the UNIQUE backstop)
        fires += 1
        _record(state, fire)
        count_on_commit(SCHEDULE_FIRES, (str(fire.outcome),))
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
        data = schedule_run_input(row, fire.fire_time)
    except CredentialMissing as exc:  # an operator's missing variable: not counted, the next slot tries again
        fire.outcome, fire.error = FireOutcome.FAILED, f"{CREDENTIALS_MISSING}: {exc}"
        fire.save(update_fields=["outcome", "error", "counted", "run_id"])
        return
    except (KeyError, TypeError, ValueError) as exc:  # a stored prompt no run can start from: fails every fire
        fire.outcome, fire.error = FireOutcome.FAILED, f"{PROMPT_REFUSED}: {exc}"
        fire.save(update_fields=["outcome", "error", "counted", "run_id"])
        return
    try:
        # No savepoint of our own: run_create raises its refusals before it writes,
        # and wraps its insert in one (a duplicate agent_id).
        run = run_create(principal=schedule_principal(row), data=data)
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
    except (ApplicationError, RedisError) as exc:
        if _is_infra(exc):
            raise InfraUnavailable(repr(exc)) from exc
        _refused(fire, exc)
    else:
        fire.run_id, fire.counted = run.id, True
    fire.save(update_fields=["outcome", "error", "counted", "run_id"])


def _refused(fire: ScheduleFire, exc: ApplicationError | RedisError) -> None:
    """A refusal of the run as the fire's outcome: a quota skips, the rest fail."""
    if isinstance(exc, QuotaExhausted):
        fire.outcome, fire.error = FireOutcome.SKIPPED, f"{exc.code}: {exc.message}"
    elif isinstance(exc, ApplicationError):  # unknown agent, unroutable model...: no run
        fire.outcome, fire.error = FireOutcome.FAILED, f"{exc.code}: {exc.message}"
        fire.counted = exc.code != UNKNOWN_AGENT  # SPEC 9.1: an unknown agent does not count


def schedule_principal(row: ScheduleDef) -> Principal:
    """Who a schedule's run is created as: the def's tenant (never anything
    else), naming the def's user_id."""
    return Principal(
        tenant_id=row.tenant_id, subject=f"schedule:{row.name}", scopes=frozenset({TENANT, ACT_AS_USER_SCOPE})
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
        credentials=schedule_credentials(d, tenant_id=row.tenant_id),
        notify_finished=True,
        defer_over_budget=True,  # a fire into a spent budget parks its run until the budget frees (issue 37)
    )


def prompt_segments(prompt: Any, name: str, slot: datetime) -> list[Segment]:
    """A ScheduleDef prompt (validated by apps.substrate.kinds.schedule)
    as run segments: text is trusted, `untrusted-block` keeps its kind. No
    prompt: one line naming the schedule and the slot. Raises ValueError on a
    stored prompt no run can start from (blank, an `assistant` role, no user
    text: rows written before validation refused them)."""
    if not prompt:
        return [Segment(text=f"Scheduled run of {name!r} for {slot.astimezone(UTC).isoformat()}.")]
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is blank")
        return [Segment(text=prompt)]
    for message in prompt:
        if message["role"] not in ("user", "system"):
            raise ValueError(f"prompt role {message['role']!r} cannot start a run (user or system)")
    # The one parser of every run's segments (apps.runs.prompt); a stored "text" block is trusted text.
    wire = [
        {
            "role": m["role"],
            "content": [{**b, "type": "trusted-text"} if b["type"] == "text" else b for b in m["content"]],
        }
        for m in prompt
    ]
    try:
        out = parse_segments(wire)
    except Invalid as exc:
        raise ValueError(exc.message) from exc
    if not any(seg.role == "user" and seg.text.strip() for seg in out):
        raise ValueError("the prompt has no user text")
    return out
