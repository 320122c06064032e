"""Creating a run: resolving and pinning its agent, its place in the queues (its session,
admission), and the insert of its row with its first transcript row and events.
Invariants:
- everything the run needs is resolved before any row is written (`run_resolve`);
- the run exists iff its transaction commits: the doorbell, `run_created` and the
  cancels of the runs it displaces in its session go out on commit, the fairness slot
  is given back on rollback (apps.runs.rollback);
- a session's decision and admission's count share the insert's transaction
  (apps.runs.backpressure), so neither is decided on rows that do not commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction

from apps.core import privileged, spend
from apps.core import toolregistry as registry
from apps.core.errors import Conflict, Invalid, NotFound, RuntimePaused
from apps.core.hosts import run_allowed_hosts
from apps.core.identity import acting_tenant_id, acting_user_id
from apps.core.ids import new_agent_id, new_run_id, new_session_id
from apps.core.redact import run_redactor
from apps.core.types import Principal
from apps.gateway import fairness
from apps.gateway.resolver import Route, resolve_route
from apps.runs import backpressure, signals, statebus, store, tracing
from apps.runs.cancel import run_cancel
from apps.runs.completion.spec import Webhook, webhook_of
from apps.runs.credentials import credentials_check, seal
from apps.runs.dispatch import enqueue_iteration
from apps.runs.inert import inert_events
from apps.runs.models import Run, RunStatus, RuntimeStateValue
from apps.runs.prompt import Segment, has_image, prompt_content, rows_have_image, system_blocks, vision_route
from apps.runs.rollback import release_slot_unless_committed
from apps.runs.run_options import RunOptions, parent_context_for, routing_with
from apps.runs.selectors import run_routing as run_routing_of
from apps.runs.selectors import runtime_state, session_has_image
from apps.runs.statuses import NO_TRACE
from apps.runs.store import webhooks
from apps.runs.wake import ring_promoted
from apps.substrate.models import AgentDef
from apps.substrate.selectors import agent_def_resolve

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
    session_id: str | None = None  # join this session (its owner's only; backpressure.session_place): None = new
    replay_session: bool = False  # the model sees the session's earlier turns (POST /v1/sessions/{id}/messages)
    multitask_strategy: str | None = None  # with session_id, when the session is busy (backpressure.Strategy)
    seed: Seed | None = None  # a fork's copied history; its segments may then be empty (no new prompt)
    options: RunOptions = field(default_factory=RunOptions)  # the request's sampling, compaction... (run_options)
    defer_over_budget: bool = False  # a schedule's fire: over any hard budget it parks waiting_budget, never 429
    retention: str = ""  # "no_trace": the tree is deleted when it ends; else the agent's (apps.runs.deletion)
    webhook: Any = None  # the request's `webhook` (apps.runs.completion.spec.WebhookIn or its dict); None: the agent's


def run_create(*, principal: Principal, data: RunCreate) -> Run:
    """Resolve and pin the agent, insert the run with its first transcript row
    and `user_input`/`system_prompt` events, enqueue step 0 on commit. The one
    way to start a run: the API, schedules and webhooks pass their credentials
    in `data.credentials` (checked here: 400 `invalid_credentials`; sealed on
    the run, apps.runs.credentials). Called inside a transaction, the run exists
    iff it commits: doorbell and `run_created` on commit, the fairness slot given
    back on rollback (apps.runs.rollback)."""
    if runtime_state() != RuntimeStateValue.RUNNING:
        raise RuntimePaused("runtime is paused; retry after resume")
    acting_tenant_id(principal, data.tenant_id)  # the run's tenant is always the principal's
    credentials = credentials_check(data.credentials)  # 400 invalid_credentials before anything else
    strategy = backpressure.strategy_of(data.multitask_strategy)  # 422 invalid_multitask_strategy
    data = dataclasses.replace(data, user_id=acting_user_id(principal, data.user_id), credentials=credentials)
    resolved = run_resolve(tenant_id=principal.tenant_id, data=data)
    # 429 token_limit_exceeded over a hard budget; a budget that defers parks the run instead (issue 37)
    spender = spend.Spender(principal.tenant_id, data.user_id, data.agent)
    deferred = spend.admit_or_raise(spender, defer=data.defer_over_budget).hard
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
        # With a `run_created` receiver, a transaction too: the signal's outbox row commits with the run,
        # as a webhook's row (apps.runs.completion) and a session's decision (sessions.promotion) do.
        listened = signals.run_created.has_listeners(Run) or resolved.webhook is not None
        atomic = gated or listened or data.session_id is not None or connection.in_atomic_block
        with transaction.atomic() if atomic else contextlib.nullcontext():
            place = _session_place(principal, data, strategy)
            status, promoted = _admission(place, limit, gated=gated)
            if deferred is not None and status == RunStatus.QUEUED:
                status = RunStatus.WAITING_BUDGET  # no doorbell: apps.budgets wakes it when the budget frees
            if parked_seed and status == RunStatus.QUEUED:
                status = RunStatus.AWAITING_INPUT  # a fork that waits for its next user turn: no doorbell
            run = run_insert(
                tenant_id=principal.tenant_id, data=data, resolved=resolved, run_id=run_id, status=status, place=place
            )
            if place is not None and place.cancel:
                # Their cancel flags commit with this run (backpressure.session_place); this finishes and
                # announces them now. robust: a failed cancel is logged; the flags still end them.
                transaction.on_commit(partial(_session_cancel, principal, place), robust=True)
            if place is not None and place.waits:  # the live run may end before this commits
                transaction.on_commit(partial(backpressure.session_promote_after_commit, place.session_id))
            if promoted:
                transaction.on_commit(lambda: ring_promoted(promoted))
            # Before the doorbell (on_commit runs in order): the worker's `running` follows it on the channel.
            statebus.announce_on_commit(tenant_id=run.tenant_id, user_id=run.user_id, run_id=run.id, status=status)
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
    place: backpressure.Place | None, limit: backpressure.Limits, *, gated: bool
) -> tuple[str, list[backpressure.Promoted]]:
    """The new run's status, and the waiting runs its admission promoted. A run enqueued
    behind its session is not admitted yet: its promotion sends it to admission."""
    if place is not None and place.waits:
        return RunStatus.WAITING_SESSION, []
    return backpressure.admission_status(limit) if gated else (RunStatus.QUEUED, [])


def _constraint(exc: IntegrityError) -> str:
    diag = getattr(exc.__cause__, "diag", None)
    return str(getattr(diag, "constraint_name", "") or "")


def _session_place(principal: Principal, data: RunCreate, strategy: backpressure.Strategy) -> backpressure.Place | None:
    if data.session_id is None:
        return None
    return backpressure.session_place(
        tenant_id=principal.tenant_id, user_id=data.user_id, session_id=data.session_id, strategy=strategy
    )


def _session_cancel(principal: Principal, place: backpressure.Place) -> None:
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
        routing=routing_with(
            run_routing(route, d, parent_id=data.parent_id), data.options, narrowed=data.allowed_hosts is not None
        ),
        webhook=None if data.parent_id else webhook_of(data.webhook or d.get("webhook"), tenant_id=tenant_id),
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


COMPACTION_KEYS = ("enabled", "target_percentage", "keep_last_n", "keep_first", "autocompact_at_pct", "model")


def compaction_routing(definition: dict[str, Any], parent_id: str | None) -> dict[str, Any]:
    """The `compaction` entry of a new run's routing: the agent's own block (its set
    fields), else its parent's pinned one, else nothing ({})."""
    own = {k: v for k, v in (definition.get("compaction") or {}).items() if k in COMPACTION_KEYS and v is not None}
    if own:
        return {"compaction": own}
    inherited = run_routing_of(run_id=parent_id).get("compaction") if parent_id else None
    return {"compaction": inherited} if inherited else {}


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
    webhook: Webhook | None = None  # its completion webhook (top-level runs only: apps.runs.completion)


def _ephemeral(data: RunCreate, r: Resolved) -> bool:
    return data.parent_id is None and any(b.get("ephemeral") for b in r.volumes)


def run_insert(
    *,
    tenant_id: str,
    data: RunCreate,
    resolved: Resolved,
    depth: int = 0,
    parent_call_id: str = "",
    run_id: str | None = None,
    status: str = RunStatus.QUEUED,
    place: backpressure.Place | None = None,
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
    # Top-level only: a sub-agent goes with its root's tree, whatever its own agent says.
    no_trace = data.parent_id is None and (data.retention or d.get("retention", "")) == NO_TRACE
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
        parent_context=parent_context_for(data.options, data.parent_id),
        # Announced to registry.on_run_finished listeners when it ends: a trigger's run, a top-level
        # run whose ephemeral volumes must go with it, a run with a webhook (its end's delivery row),
        # a top-level no-trace run (its end deletes its tree: apps.lifecycle.notrace).
        notify_finished=data.notify_finished or r.webhook is not None or _ephemeral(data, r) or no_trace,
        retention=NO_TRACE if no_trace else "",
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
    if r.webhook is not None:  # in the caller's transaction (run_create opens one for it)
        webhooks.attach(run_id=run.id, tenant_id=tenant_id, webhook=r.webhook)
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
    events.extend(inert_events(r.agent_def.definition, data.options, r.routing))  # no silent drops
    return events
