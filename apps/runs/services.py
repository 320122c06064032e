"""Run verbs that change state. Invariants:
- every state change of a run that is not leased is a conditional UPDATE on
  its current status, so a wake-up or cancel happens exactly once;
- a run that holds a lease is changed only by its worker (fenced commit);
  others set flags (cancel) or queue rows (input) and ring the doorbell;
- doorbells, cancel signals and stream notifications go out on commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction

from apps.core import privileged
from apps.core.errors import Conflict, Invalid, NotFound, QuotaExhausted, RuntimePaused, Unprocessable
from apps.core.hosts import run_allowed_hosts
from apps.core.http import db_call
from apps.core.identity import acting_tenant_id, acting_user_id
from apps.core.ids import new_agent_id, new_run_id, new_session_id
from apps.core.redact import Redactor, run_redactor, runtime_redactor
from apps.core.types import Principal
from apps.gateway import fairness
from apps.gateway.resolver import Route, resolve_route
from apps.runs import backpressure, registry, sessions, signals, store, tracing
from apps.runs.compaction_service import compaction_routing
from apps.runs.credentials import credentials_check, run_redactor_of, seal
from apps.runs.dispatch import broker_emptied, broker_mark, enqueue_iteration, notify_events
from apps.runs.live import publish_cancel
from apps.runs.models import (
    PARKED,
    RUNNABLE,
    TERMINAL,
    Run,
    RunStatus,
    RuntimeState,
    RuntimeStateValue,
)
from apps.runs.prompt import Segment, has_image, prompt_content, rows_have_image, system_blocks, vision_route
from apps.runs.resident import resident_run_ended
from apps.runs.rollback import release_slot_unless_committed
from apps.runs.selectors import (
    paused_runs_count,
    run_get,
    run_notifies_finished,
    runs_liveness,
    runs_orphaned,
    runtime_state,
)
from apps.runs.session_selectors import session_has_image
from apps.runs.subruns import run_child_finished
from apps.runs.wake import ring_promoted, run_slot_freed
from apps.substrate.models import AgentDef
from apps.substrate.selectors import agent_def_resolve

log = logging.getLogger("loomcycle.runs")

UNBOUNDED_ITERATIONS = 2**20


@dataclass(frozen=True)
class Seed:
    """A run that starts from copied history (a fork, apps.runs.fork): its first
    transcript rows, events appended before the run's own, its lineage, and
    whether it starts parked at awaiting_input (the history ended a turn and
    no prompt was given)."""

    history: list[tuple[str, list[dict[str, Any]]]]
    events: list[dict[str, Any]]
    from_run_id: str
    at_step: int
    parked: bool = False


@dataclass(frozen=True)
class RunCreate:
    agent: str
    segments: list[Segment]
    tools: list[str] | None = None
    allowed_hosts: list[str] | None = None  # SPEC 6.1's three states: None = omitted
    user_id: str = ""
    agent_id: str | None = None
    metadata: dict[str, Any] | None = None
    interactive: bool | None = None
    max_iterations: int | None = None
    parent_id: str | None = None  # set by sub-agent spawns
    user_tier: str | None = None
    tenant_id: str = ""  # the request's claim: only logged, the principal's tenant wins (SPEC 8)
    # user_bearer (under "user_bearer") + user_credentials: sealed on the run, never in clear (apps.runs.credentials)
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)
    notify_finished: bool = False  # a trigger's run: the engine tells registry.on_run_finished listeners
    session_id: str | None = None  # join this session (its owner's only; apps.runs.sessions): None = a new one
    replay_session: bool = False  # the model sees the session's earlier turns (POST /v1/sessions/{id}/messages)
    multitask_strategy: str | None = None  # with session_id, when the session is busy (apps.runs.sessions)
    seed: Seed | None = None  # a fork's copied history; its segments may then be empty (no new prompt)


def runtime_state_get() -> str:
    return runtime_state()


def run_create(*, principal: Principal, data: RunCreate) -> Run:
    """Resolve and pin the agent, insert the run with its first transcript row
    and `user_input`/`system_prompt` events, enqueue step 0 on commit. The one
    way to start a run: the API, schedules and webhooks pass their credentials
    in `data.credentials` (checked here: 400 `invalid_credentials`; sealed on
    the run, apps.runs.credentials). Called inside a transaction, the run exists
    iff it commits: doorbell and `run_created` on commit, the fairness slot given
    back on rollback (apps.runs.rollback)."""
    if runtime_state_get() != RuntimeStateValue.RUNNING:
        raise RuntimePaused("runtime is paused; retry after resume")
    acting_tenant_id(principal, data.tenant_id)  # the run's tenant is always the principal's
    credentials = credentials_check(data.credentials)  # 400 invalid_credentials before anything else
    strategy = sessions.strategy_of(data.multitask_strategy)  # 422 invalid_multitask_strategy
    data = dataclasses.replace(data, user_id=acting_user_id(principal, data.user_id), credentials=credentials)
    resolved = run_resolve(tenant_id=principal.tenant_id, data=data)
    run_id = new_run_id()
    if data.parent_id is None:  # fairness (SPEC 9.6): 429 over cap; a child's slot: subruns.spawn_prepare
        fairness.run_slot_take(run_id=run_id, tenant_id=principal.tenant_id, user_id=data.user_id)
        # Inside the caller's transaction: given back if it, or a savepoint around this, rolls back
        # (apps.runs.rollback).
        release_slot_unless_committed(run_id)
    limit = backpressure.limits()
    # A fork parked at awaiting_input skips the admission queue: it runs no model turn until its input
    # wakes it, and holds an admission slot from its insert, as every interactive run parked at
    # awaiting_input does (backpressure counts it as admitted).
    parked_seed = data.seed is not None and data.seed.parked
    gated = data.parent_id is None and limit.max_concurrent_runs > 0 and not parked_seed
    inserted = False
    try:
        # One statement (autocommit) unless the caller holds a transaction: then a savepoint,
        # so that a duplicate agent_id leaves the caller's transaction usable. With admission
        # on, the admission lock and the insert share one transaction (apps.runs.backpressure).
        # With a `run_created` receiver, a transaction too: the signal's outbox row commits with the run.
        listened = signals.run_created.has_listeners(Run)
        # A session's decision (apps.runs.sessions) and the insert share one transaction too.
        atomic = gated or listened or data.session_id is not None or connection.in_atomic_block
        with transaction.atomic() if atomic else contextlib.nullcontext():
            place = _session_place(principal, data, strategy)
            status, promoted = _admission(place, limit, gated=gated)
            if parked_seed and status == RunStatus.QUEUED:
                status = RunStatus.AWAITING_INPUT  # a fork that waits for its next user turn: no doorbell
            run = run_insert(
                tenant_id=principal.tenant_id, data=data, resolved=resolved, run_id=run_id, status=status, place=place
            )
            if place is not None and place.cancel:
                # Their cancel flags commit with this run (sessions.session_place); this finishes and
                # announces them now. robust: a failed cancel is logged; the flags still end them.
                transaction.on_commit(partial(_session_cancel, principal, place), robust=True)
            if place is not None and place.waits:  # the live run may end before this commits
                transaction.on_commit(partial(sessions.session_promote_after_commit, place.session_id))
            if promoted:
                transaction.on_commit(lambda: ring_promoted(promoted))
            if status == RunStatus.QUEUED:
                transaction.on_commit(lambda: enqueue_iteration(run.id, 0))
            signals.send_on_commit(
                signals.run_created,
                run_id=run.id,
                tenant_id=run.tenant_id,
                user_id=run.user_id,
                parent_id=run.parent_id,
            )
        inserted = True
    except IntegrityError as exc:  # the unique agent_id, also under a concurrent create
        if _constraint(exc) == "run_session_live":  # the session lock makes this a backstop only
            raise Conflict(f"session {data.session_id} has a run in flight", code="session_busy") from exc
        raise Conflict(f"agent_id {resolved.agent_id!r} is already in use", code="agent_id_in_use") from exc
    finally:
        if not inserted:
            fairness.run_slot_release(run_id)
    return run


def _admission(
    place: sessions.Place | None, limit: backpressure.Limits, *, gated: bool
) -> tuple[str, list[backpressure.Promoted]]:
    """The new run's status, and the waiting runs its admission promoted. A run enqueued
    behind its session is not admitted yet: its promotion sends it to admission."""
    if place is not None and place.waits:
        return RunStatus.WAITING_SESSION, []
    return backpressure.admission_status(limit) if gated else (RunStatus.QUEUED, [])


def _constraint(exc: IntegrityError) -> str:
    diag = getattr(exc.__cause__, "diag", None)
    return str(getattr(diag, "constraint_name", "") or "")


def _session_place(principal: Principal, data: RunCreate, strategy: sessions.Strategy) -> sessions.Place | None:
    if data.session_id is None:
        return None
    return sessions.session_place(
        tenant_id=principal.tenant_id, user_id=data.user_id, session_id=data.session_id, strategy=strategy
    )


def _session_cancel(principal: Principal, place: sessions.Place) -> None:
    """After the new run committed (interrupt, rollback): finish the runs it displaces
    (their cancel flags committed with it). Each one's end (here, or its worker's)
    starts the next enqueued run (sessions.session_next)."""
    for run_id in place.cancel:
        try:
            run_cancel(principal=principal, run_id=run_id, reason=place.reason)
        except NotFound:  # ended and its row went meanwhile: nothing left to cancel
            continue


def run_resolve(*, tenant_id: str, data: RunCreate) -> Resolved:
    """Everything a run needs, resolved before any row is written (no writes here)."""
    try:
        agent_def = agent_def_resolve(tenant_id=tenant_id, name=data.agent)
    except NotFound as exc:  # loomcycle answers 400 for an unknown agent on /v1/runs
        raise Invalid(exc.message, code="unknown_agent") from exc
    d = agent_def.definition
    route = resolve_route(user_tier=data.user_tier, agent=d)  # 400/403/503 before any row exists
    route = vision_route(route, image=has_image(data.segments) or _history_has_image(tenant_id, data))
    allowed_hosts = list(run_allowed_hosts(data.allowed_hosts))
    no_prompt = data.seed is not None and not data.segments  # a fork without a new prompt
    request_system, user_content = ([], []) if no_prompt else prompt_content(data.segments, hosts=allowed_hosts)
    interactive = bool(d.get("interactive", False)) if data.interactive is None else data.interactive
    agent_cap = d.get("max_iterations") or (
        UNBOUNDED_ITERATIONS if interactive or d.get("unbounded_iterations") else 16
    )
    max_it = min(data.max_iterations, agent_cap) if data.max_iterations else agent_cap  # a caller only narrows
    tools = run_tools(agent_def=agent_def, caller=data.tools, tenant_id=tenant_id)
    volumes = registry.resolve_volumes(tenant_id=tenant_id, definition=d, parent_id=data.parent_id)
    return Resolved(
        agent_def=agent_def,
        agent_id=data.agent_id or new_agent_id(),
        volumes=volumes,
        interactive=interactive,
        max_iterations=max_it,
        tools=tools,
        allowed_hosts=allowed_hosts,
        user_content=user_content,
        system=system_blocks(str(d.get("system_prompt", "")), request_system, data.metadata or {}),
        routing=run_routing(route, d, parent_id=data.parent_id),
    )


def _history_has_image(tenant_id: str, data: RunCreate) -> bool:
    """Whether the history the run's model sees first holds an image: a fork's copied rows,
    or the session's earlier turns a continuation replays (loomcycle checks prior turns too)."""
    if data.seed is not None and rows_have_image(data.seed.history):
        return True
    if data.replay_session and data.session_id:
        return session_has_image(tenant_id=tenant_id, session_id=data.session_id)
    return False


def run_tools(*, agent_def: AgentDef, caller: list[str] | None, tenant_id: str) -> list[str]:
    """A run's tools: the operator's floor, the agent's (with Context and Skill), the caller's
    narrowing, less the privileged ones this agent may not use (apps.core.privileged).
    Run creation and snapshot restore both derive them here."""
    d = agent_def.definition
    tools = registry.effective_tools(
        operator=list(settings.LOOMCYCLE.tools_enabled),
        agent=list(d.get("tools", [])),
        caller=caller,
        disable_context=bool(d.get("disable_context", False)),
        skills=[str(p) for p in d.get("skills") or []],
        tenant_id=tenant_id,
    )
    return privileged.narrowed(tools, tenant_id=tenant_id, operator_yaml=agent_def.is_operator_yaml)


def run_routing(route: Route, definition: dict[str, Any], *, parent_id: str | None) -> dict[str, Any]:
    """What the run row pins of its routing and compaction (run creation and snapshot restore)."""
    return routing_of(route, definition) | compaction_routing(definition, parent_id)


def routing_of(route: Route, definition: dict[str, Any]) -> dict[str, Any]:
    """What the run row pins of its routing: the candidates, the fallback
    policy, and the model options every candidate is called with."""
    sampling = definition.get("sampling") or {}
    return {
        "candidates": [c.as_dict() for c in route.candidates],
        "policy": route.policy.as_dict(),
        "user_tier": route.user_tier,
        "tier": route.tier,
        "effort": str(definition.get("effort") or ""),
        "sampling": {k: v for k, v in sampling.items() if v is not None},
    }


@dataclass(frozen=True)
class Resolved:
    """What run_resolve resolved before writing anything."""

    agent_def: AgentDef
    agent_id: str
    interactive: bool
    max_iterations: int
    tools: list[str]
    allowed_hosts: list[str]
    user_content: list[dict[str, Any]]  # the first user message's blocks
    system: list[str]
    routing: dict[str, Any]
    volumes: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # registry.resolve_volumes


def run_insert(
    *,
    tenant_id: str,
    data: RunCreate,
    resolved: Resolved,
    depth: int = 0,
    parent_call_id: str = "",
    run_id: str | None = None,
    status: str = RunStatus.QUEUED,
    place: sessions.Place | None = None,
    transcript: list[tuple[str, list[dict[str, Any]]]] | None = None,
) -> Run:
    """Insert the run and its first rows (redacted with the run's credentials,
    which are sealed on the row); the caller owns the transaction and the doorbell.
    `place`: its turn in an existing session (else a new session); `transcript`
    replaces its first message (a session replay's seed)."""
    r = resolved
    d = r.agent_def.definition
    events = _first_events(data, r)
    run_id = run_id or new_run_id()
    run = Run(
        id=run_id,
        agent_id=r.agent_id,
        session_id=place.session_id if place else new_session_id(),
        session_turn=place.turn if place else 0,
        replays_session=data.replay_session,
        tenant_id=tenant_id,
        user_id=data.user_id,
        agent_name=r.agent_def.name,
        agent_def=r.agent_def,
        agent_def_sha256=r.agent_def.content_sha256,
        provider=r.routing["candidates"][0]["provider"],
        model=r.routing["candidates"][0]["model"],
        routing=r.routing,
        system=r.system,
        max_tokens=int(d.get("max_tokens", 4096)),
        interactive=r.interactive,
        max_iterations=r.max_iterations,
        tools=r.tools,
        caller_tools=data.tools,
        allowed_hosts=r.allowed_hosts,
        volumes=r.volumes,
        metadata=data.metadata or {},
        # Announced to registry.on_run_finished listeners when it ends: a trigger's run, or a
        # top-level run whose ephemeral volumes must go with it.
        notify_finished=data.notify_finished or (data.parent_id is None and any(b.get("ephemeral") for b in r.volumes)),
        parent_id=data.parent_id,
        parent_call_id=parent_call_id,
        depth=depth,
        status=status,
        credentials_sealed=seal(run_id=run_id, credentials=data.credentials),
    )
    seed = data.seed
    if seed is not None:
        run.forked_from_run_id, run.forked_at_step = seed.from_run_id, seed.at_step
        events = [*seed.events, *events]
        if seed.parked:
            events.append({"type": "awaiting_input", "awaiting_input": {"since_turn": 0}})
    with tracing.run_created(run):  # the run's root span; its context is stored with the row
        store.insert_run(
            run,
            # A session replay's seed `transcript` replaces the first message; a fork's history precedes it.
            first_message=r.user_content if r.user_content and transcript is None else None,
            events=events,
            redactor=run_redactor(data.credentials),
            history=transcript if transcript is not None else (seed.history if seed is not None else None),
        )
    return run


def _first_events(data: RunCreate, r: Resolved) -> list[dict[str, Any]]:
    pinned = {
        "agent_def_id": r.agent_def.id,
        "agent_def_version": r.agent_def.version,
        "content_sha256": r.agent_def.content_sha256,
    }
    events: list[dict[str, Any]] = []
    if data.segments:  # a fork without a new prompt has no user input of its own
        segments = [seg.as_event() for seg in data.segments]  # an image's bytes only in the transcript
        events.append({"type": "user_input", "segments": segments, **pinned})
    if r.system:
        events.append({"type": "system_prompt", "system_prompt": "\n\n".join(r.system), **pinned})
    return events


def _live_descendants(run: Run) -> list[Run]:
    """Breadth-first over children that are not terminal."""
    found: list[Run] = []
    frontier = [run.id]
    while frontier:
        kids = list(Run.objects.filter(parent_id__in=frontier).exclude(status__in=TERMINAL))
        found.extend(kids)
        frontier = [k.id for k in kids]
    return found


def run_cancel(
    *, principal: Principal, agent_id: str | None = None, run_id: str | None = None, reason: str = ""
) -> dict[str, Any]:
    """Cancel a run (by `agent_id`, else `run_id`) and its live descendants. Idempotent on terminal runs."""
    run = run_get(tenant_id=principal.read_tenant, agent_id=agent_id, run_id=run_id, owner=principal.read_user)
    if run.status in TERMINAL:
        return {"cancelled": False, "agent_id": run.agent_id, "status": run.status}
    reason = reason or "cancelled by api"
    descendants = _cancel_tree(run, reason)
    return {
        "cancelled": True,
        "agent_id": run.agent_id,
        "cascaded": [d.agent_id for d in descendants],
        "reason": reason,
    }


def run_stop(*, run_id: str, reason: str) -> bool:
    """Cancel a run and its live descendants for the runtime itself, with no caller to
    check (a resident child closed by its parent, its idle TTL or its parent's end).
    False when the run had ended already."""
    run = Run.objects.filter(id=run_id).first()
    if run is None or run.status in TERMINAL:
        return False
    _cancel_tree(run, reason)
    return True


def _cancel_tree(run: Run, reason: str) -> list[Run]:
    """Finish (or signal the lease holder of) `run` and its live descendants; the descendants.
    The root is flagged BEFORE its descendants are read: a child inserted by a park that commits
    meanwhile is either read here or inserted under a flagged parent (which starts no more
    waiting siblings). What a crash mid-way leaves, the lease sweep's orphan backstop ends
    (run_orphans_cancel)."""
    # Descendants hold the parent's credentials or fewer (apps.runs.subruns): its redactor covers them.
    redactor = run_redactor_of(run_id=run.id, sealed=run.credentials_sealed)
    signal: list[str] = []
    finished: list[signals.Delivery] = []
    if not _finish_unleased(run.id, reason, redactor, finished):
        signal.append(run.id)
    descendants = _live_descendants(run)
    for target in descendants:
        if not _finish_unleased(target.id, "parent run cancelled", redactor, finished):
            signal.append(target.id)
    if signal:
        publish_cancel(signal)  # leased runs: the worker holding the lease finishes them
    # The deployment's run_finished receivers run after every run of the tree is finished or signalled.
    transaction.on_commit(lambda: signals.deliver_all(finished))
    return descendants


def _finish_unleased(run_id: str, reason: str, redactor: Redactor, finished: list[signals.Delivery]) -> bool:
    """Set the cancel flag; finish the run here if no worker holds a lease. Its run_finished outbox row
    (with a receiver) is appended to `finished`, for the caller to deliver once the whole tree is done."""
    with transaction.atomic():
        seq = store.cancel(run_id=run_id, reason=reason, redactor=redactor)
        if seq is None:
            return False
        transaction.on_commit(lambda: notify_events(run_id, seq))
        transaction.on_commit(lambda: run_child_finished(child_id=run_id))  # a no-op for top-level runs
        transaction.on_commit(lambda: resident_run_ended(run_id=run_id))  # its resident rows (apps.runs.resident)
        transaction.on_commit(lambda: fairness.run_slot_release(run_id))
        transaction.on_commit(lambda: run_slot_freed(run_id))  # its admission slot (or queue place) is free
        transaction.on_commit(lambda: _announce_if_notified(run_id, RunStatus.CANCELLED))
        delivery = signals.record(signals.run_finished, run_id=run_id, status=RunStatus.CANCELLED)
    if delivery is not None:
        finished.append(delivery)
    return True


def _announce_if_notified(run_id: str, status: str) -> None:
    """registry.on_run_finished listeners hear of a notify_finished run cancelled without a worker."""
    if run_notifies_finished(run_id=run_id):
        registry.run_finished(run_id, status)


def run_input(*, principal: Principal, run_id: str, text: str) -> dict[str, Any]:
    """Queue steering text; a parked interactive run is woken to consume it."""
    if not text.strip():
        raise Unprocessable("text must not be empty", code="empty_input")
    run = run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    if run.status in TERMINAL:
        raise NotFound(f"run {run_id} is not in flight", code="not_in_flight")
    cap = settings.LOOMCYCLE.steer_queue_cap
    with signals.atomic_if_listened(signals.run_resumed):  # its outbox row commits with the wake
        queued = store.input_queue(run_id=run.id, text=text, cap=cap)
        if queued.woke:
            ring = partial(enqueue_iteration, run.id, queued.step)
            transaction.on_commit(lambda: tracing.woken(run.trace_context, run_id=run.id, reason="input", ring=ring))
            signals.send_on_commit(signals.run_resumed, run_id=run.id)
    if not queued.accepted:
        raise QuotaExhausted(f"steering queue is full ({cap})", code="steer_queue_full", headers={"Retry-After": "1"})
    return {"run_id": run.id, "delivered": True}


PAUSE_POLL_S = 0.1


async def runtime_pause(*, timeout_ms: int = 30_000) -> dict[str, Any]:
    """Park every run at its next boundary; wait up to `timeout_ms` for in-flight
    iterations. The wait holds no thread: a DB check every PAUSE_POLL_S on the
    event loop. The runtime is `paused` when this returns, even on timeout (the
    stragglers park at their boundary) or when the caller went away, unless a
    resume came first: `state` says which."""
    started = time.monotonic()
    await db_call(_pause_begin)()
    left = await db_call(runtime_pause_settle)(force=False)
    deadline = started + timeout_ms / 1000
    try:
        while left and time.monotonic() < deadline:
            await asyncio.sleep(PAUSE_POLL_S)
            left = await db_call(runtime_pause_settle)(force=False)
    finally:
        if left:  # timed out, or the request was cancelled: paused anyway, as the timeout says
            left = await db_call(runtime_pause_settle)(force=True)
    warnings = [f"{left} run(s) had not parked after {timeout_ms} ms; they park at their next boundary"] if left else []
    return {
        "state": await db_call(runtime_state)(),
        "duration_ms": int((time.monotonic() - started) * 1000),
        "force_cancelled_count": 0,
        "paused_runs_count": await db_call(paused_runs_count)(),
        "warnings": warnings,
    }


def runtime_pause_start() -> dict[str, Any]:
    """Begin a pause without waiting for it (the admin's button: no request thread waits).
    Paused at once when no run is inside an iteration; else `pausing`, which the lease sweep
    settles once the last one has parked (runtime_pause_settle)."""
    _pause_begin()
    left = runtime_pause_settle(force=False)
    return {"state": runtime_state(), "runnable_runs_count": left, "paused_runs_count": paused_runs_count()}


def _pause_begin() -> None:
    with transaction.atomic():
        if store.runtime_state_lock() != RuntimeStateValue.RUNNING:
            raise Conflict("runtime is already paused or pausing", code="already_pausing")
        store.runtime_state_set(RuntimeStateValue.PAUSING)
    # Unleased runnable runs park right away; their queued doorbells become no-ops.
    store.runs_pause_unleased()


def runtime_pause_settle(*, force: bool = False) -> int:
    """`pausing` -> `paused` once no run is runnable (at once with `force`);
    the number of runs still runnable. The lease sweep calls it too, so a pause
    whose web process died still settles."""
    if not RuntimeState.objects.filter(id=1, state=RuntimeStateValue.PAUSING).exists():
        return 0  # not pausing (never was, already settled, or resumed meanwhile)
    left = Run.objects.filter(status__in=RUNNABLE).count()
    if force or not left:
        store.runtime_state_set(RuntimeStateValue.PAUSED, only_from=RuntimeStateValue.PAUSING)
    return left


def runtime_resume() -> dict[str, Any]:
    with transaction.atomic():
        if store.runtime_state_lock() == RuntimeStateValue.RUNNING:
            raise Conflict("runtime is not paused", code="not_paused")
        store.runtime_state_set(RuntimeStateValue.RUNNING)
        resumed = store.runs_resume_paused()
        transaction.on_commit(lambda: _enqueue_all(resumed))
        for run_id, _step in resumed:
            signals.send_on_commit(signals.run_resumed, run_id=run_id)
    return {"state": "running", "resumed_runs_count": len(resumed), "warnings": []}


def run_leases_sweep() -> int:
    """Requeue runnable runs whose lease expired (crashed worker) or that sat
    unleased past the grace period (a doorbell lost before it was sent).
    Each run gets at most one doorbell per grace period. Leases are compared
    with Postgres's clock, as the claim and the heartbeat set them: a sweeper
    host whose clock runs ahead must not take live leases.
    After Redis lost its data (`broker_emptied`), every doorbell queued in it is
    gone: the grace is 0 for that one sweep, so every unleased runnable run is
    rung at once (a run whose doorbell was in fact sent since gets a duplicate,
    a no-op at the claim). The mark is set again only after the requeue committed."""
    emptied = broker_emptied()
    grace = 0.0 if emptied else settings.LOOMCYCLE.requeue_grace_seconds
    with transaction.atomic():
        stale = store.runs_stale_release(grace_seconds=grace)
        if stale:
            transaction.on_commit(lambda: _enqueue_all(stale))
    if emptied:
        log.warning("Redis lost its data (no broker mark): rang %d unleased run(s) at once", len(stale))
        broker_mark()
    if stale:
        log.info("sweeper requeued %d run(s)", len(stale))
    return len(stale)


def run_parked_cancels_finish() -> int:
    """Finish parked runs whose cancel flag is set: a cancel meant for a worker
    that then parked the run (the step commit turns such parks into doorbells;
    this sweep finishes any that got through, e.g. parked before that fix)."""
    parked = Run.objects.filter(status__in=PARKED, cancel_requested=True)  # index run_parked_cancel
    deliveries: list[signals.Delivery] = []
    finished = sum(
        _finish_unleased(run_id, reason, runtime_redactor(), deliveries)  # the reason was stored redacted already
        for run_id, reason in parked.values_list("id", "cancel_reason")[:1000]
    )
    signals.deliver_all(deliveries, close_connection=True)  # a sweep, in a worker
    if finished:
        log.info("sweeper finished %d parked run(s) whose cancel had not landed", finished)
    return finished


ORPHAN_BATCH = 200


def run_orphans_cancel() -> int:
    """Beat backstop: cancel (with what they spawned) live runs whose parent has ended: children a
    park inserted while its parent's cancel read its tree, `waiting_fanout` children of an ended
    parent, what a crash in the middle of a cascade left. Bounded per sweep; the count cancelled."""
    done = sum(run_stop(run_id=run_id, reason="parent run ended") for run_id in runs_orphaned(limit=ORPHAN_BATCH))
    if done:
        log.warning("sweeper cancelled %d run(s) whose parent had ended", done)
    return done


def run_slots_reconcile() -> int:
    """Beat: refresh the fairness slots of live runs, free those of terminal or
    vanished runs (a process that died before releasing leaks nothing for long)."""
    done = fairness.run_slots_reconcile(liveness=lambda ids: runs_liveness(run_ids=ids))
    if done.freed:
        log.info("fairness: freed %d slot(s) of finished or vanished runs", done.freed)
    return done.freed


def _enqueue_all(doorbells: list[tuple[str, int]]) -> None:
    for run_id, step in doorbells:
        enqueue_iteration(run_id, step)
