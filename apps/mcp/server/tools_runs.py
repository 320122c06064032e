"""Run tools: spawn_run (optionally waiting for the result), get_run,
run_events, cancel_run, send_input, interruption_resolve. Each mirrors a REST route of
apps/runs/api.py and calls the same services/selectors with the caller's
principal; the run a principal may see is the one `selectors.run_get` returns
for its read tenant and read user (another tenant's run is `not_found`).

The wait of `spawn_run` holds no thread: it follows the run's events as the
SSE stream does (`apps.runs.streams.run_frames`: Redis doorbells, Postgres
reads in pages), holds a stream slot as SSE does, and ends at the run's end or
at `wait_seconds`, cut to LOOMCYCLE_MCP_WAIT_CAP_MS (then `timed_out: true`).
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Annotated, Any, Literal

from django.conf import settings
from pydantic import Field, ValidationError, WithJsonSchema, model_validator

from apps.core.errors import Invalid
from apps.core.http import db_call
from apps.core.ids import IDENT_RE
from apps.core.timefmt import ts
from apps.core.types import Principal
from apps.gateway.fairness.streams import astream_slot
from apps.mcp.server.tooltable import Args, McpTool, register
from apps.runs import selectors, services
from apps.runs.api import run_create_data
from apps.runs.interrupts import services as interrupts
from apps.runs.models import Run
from apps.runs.presenters import agent_out
from apps.runs.prompt import NULLABLE_SEGMENTS_SCHEMA
from apps.runs.run_options import CompactionIn, ParentContextIn, SamplingIn
from apps.runs.schemas import RunCreateIn
from apps.runs.streams import run_frames
from apps.substrate.auth import RUNS_CREATE, RUNS_READ


def _run_id() -> Any:
    return Field(pattern=f"^{IDENT_RE.pattern}$", description="the run's id (r_...)")


class RunBodyArgs(Args):
    """The `POST /v1/runs` body fields the MCP run tools take (loomcycle's spawn_run shape);
    parsed again by the REST schema (RunCreateIn), so every rule is the route's."""

    agent: str = Field(min_length=1, max_length=128, description="agent name (yaml or AgentDef)")
    prompt: str | None = Field(default=None, description="the user prompt (one trusted-text user segment)")
    segments: Annotated[list[Any] | None, WithJsonSchema(NULLABLE_SEGMENTS_SCHEMA)] = Field(
        default=None,
        description="loomcycle's prompt segments, each {role: system|user, content: [blocks]} "
        "(blocks: trusted-text, untrusted-block, image); wins over prompt",
    )
    tenant_id: str | None = Field(default=None, description="ignored: the token's tenant is authoritative")
    user_id: str | None = Field(default=None, description="end user the run acts for")
    agent_id: str | None = Field(default=None, description="caller-supplied tracking handle")
    user_tier: str | None = None
    user_bearer: str | None = Field(default=None, description="per-run bearer for ${run.user_bearer} in MCP headers")
    user_credentials: dict[str, str] | None = Field(default=None, description="per-run ${run.credentials.<name>}")
    metadata: dict[str, Any] | None = None
    tools: list[str] | None = Field(default=None, description="narrow the agent's tools to these")
    allowed_hosts: list[str] | None = Field(
        default=None, description="omit: the operator's hosts; []: no outbound HTTP; a list: intersected"
    )
    web_search_filter: Literal["drop", "keep"] | None = Field(
        default=None, description="with allowed_hosts: drop (default) or keep WebSearch results outside them"
    )
    parent_context: ParentContextIn | None = None
    sampling: SamplingIn | None = None
    compaction: CompactionIn | None = None
    interactive: bool | None = None
    max_iterations: int | None = Field(default=None, ge=1, le=2**20)

    def rest_body(self) -> RunCreateIn:
        """The same body as REST's, checked by its schema (identifiers, segments, hosts)."""
        try:
            return RunCreateIn.model_validate(self.model_dump(exclude_unset=True, exclude=_TRANSPORT_ONLY))
        except ValidationError as exc:
            where = ".".join(str(p) for p in exc.errors()[0]["loc"])
            raise Invalid(f"{where}: {exc.errors()[0]['msg']}", code="invalid_body") from exc


_TRANSPORT_ONLY = {"wait", "wait_seconds"}


class SpawnRunArgs(RunBodyArgs):
    session_id: str | None = Field(default=None, description="continue this session (POST /v1/runs's session_id)")
    wait: bool = Field(default=False, description="hold the call until the run ends (bounded by wait_seconds)")
    wait_seconds: int = Field(default=60, ge=1, le=86_400, description="longest wait; cut to the server's cap")


class RunArgs(Args):
    """A run by `run_id`, or by `agent_id` (loomcycle's handle for get_run / cancel_run / compact_run)."""

    run_id: str | None = Field(default=None, pattern=f"^{IDENT_RE.pattern}$", description="the run's id (r_...)")
    agent_id: str | None = Field(
        default=None, pattern=f"^{IDENT_RE.pattern}$", description="the run's agent_id (instead of run_id)"
    )

    @model_validator(mode="after")
    def _one_handle(self) -> RunArgs:
        if (self.run_id is None) == (self.agent_id is None):
            raise ValueError("give run_id or agent_id, one of them")
        return self

    def visible(self, principal: Principal) -> Run:
        """The run as the caller may see it (another tenant's is not_found)."""
        return selectors.run_get(
            tenant_id=principal.read_tenant, run_id=self.run_id, agent_id=self.agent_id, owner=principal.read_user
        )


class RunEventsArgs(Args):
    run_id: str = _run_id()
    from_seq: int = Field(default=0, ge=0, description="events with seq > from_seq")
    limit: int = Field(default=500, ge=1, le=5000)


class CancelRunArgs(RunArgs):
    reason: str = Field(default="", max_length=1024)


class SendInputArgs(Args):
    run_id: str = _run_id()
    text: str = Field(min_length=1, max_length=1024 * 1024, description="steering text, or the next turn")


class InterruptionResolveArgs(Args):
    run_id: str = _run_id()
    interrupt_id: str = Field(pattern=f"^{IDENT_RE.pattern}$", description="the interrupt's id (intr_...)")
    answer: Any = Field(default=None, description="the answer; one of the ask's options when it gave some")
    disposition: str = Field(default="answer", max_length=32, description="answer, or declined (no answer)")
    note: str = Field(default="", max_length=8192, description="a decline's reason")
    resolved_by: str = Field(default="mcp", min_length=1, max_length=128, description="who answered")
    kind: str | None = Field(default=None, max_length=32, description="the interrupt's kind (question), if given")


def _create(principal: Principal, args: SpawnRunArgs) -> dict[str, Any]:
    run = services.run_create(principal=principal, data=run_create_data(args.rest_body()))  # REST's mapping
    return {"agent_id": run.agent_id, "run_id": run.id, "session_id": run.session_id, "status": run.status}


def _visible(principal: Principal, run_id: str) -> Run:
    return selectors.run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)


def _run_out(principal: Principal, run_id: str) -> dict[str, Any]:
    return agent_out(_visible(principal, run_id))


async def _final_text(run_id: str, seconds: float) -> tuple[str | None, bool]:
    """The last `text` event's text once the run ends, and whether the wait timed out first."""
    text: str | None = None
    try:
        async with asyncio.timeout(seconds):
            async with aclosing(run_frames(run_id, 0, keepalive_s=seconds + 60, live=False)) as frames:
                async for frame in frames:
                    if frame.event == "text":
                        text = str(frame.data.get("text", ""))
    except TimeoutError:
        return text, True
    return text, False


async def spawn_run(principal: Principal, args: SpawnRunArgs) -> dict[str, Any]:
    if not args.wait:
        return await db_call(_create)(principal, args)
    slot = await astream_slot(principal)  # before the run exists: a 429 here starts nothing
    async with slot.held():
        out = await db_call(_create)(principal, args)
        seconds = min(args.wait_seconds, settings.LOOMCYCLE.mcp_wait_cap_ms / 1000)
        text, timed_out = await _final_text(out["run_id"], seconds)
    run = await db_call(_run_out)(principal, out["run_id"])
    return {**out, "status": run["status"], "result": text, "timed_out": timed_out, "run": run}


def _get(principal: Principal, args: RunArgs) -> dict[str, Any]:
    return agent_out(args.visible(principal))


async def get_run(principal: Principal, args: RunArgs) -> dict[str, Any]:
    return await db_call(_get)(principal, args)


def _events(principal: Principal, args: RunEventsArgs) -> dict[str, Any]:
    run = _visible(principal, args.run_id)
    rows = selectors.run_events_since(run_id=run.id, from_seq=args.from_seq, limit=args.limit)
    events = [{**r, "created_at": ts(r["created_at"])} for r in rows]
    status = agent_out(run)["status"]
    return {"run_id": run.id, "events": events, "last_seq": run.last_seq, "status": status, "state": run.status}


async def run_events(principal: Principal, args: RunEventsArgs) -> dict[str, Any]:
    return await db_call(_events)(principal, args)


def _cancel(principal: Principal, args: CancelRunArgs) -> dict[str, Any]:
    run = args.visible(principal)
    return services.run_cancel(principal=principal, agent_id=run.agent_id, reason=args.reason)


async def cancel_run(principal: Principal, args: CancelRunArgs) -> dict[str, Any]:
    return await db_call(_cancel)(principal, args)


async def send_input(principal: Principal, args: SendInputArgs) -> dict[str, Any]:
    return await db_call(services.run_input)(principal=principal, run_id=args.run_id, text=args.text)


def _resolve(principal: Principal, args: InterruptionResolveArgs) -> dict[str, Any]:
    reply = interrupts.caller_resolve(
        answer=args.answer, disposition=args.disposition, resolved_by=args.resolved_by, note=args.note, kind=args.kind
    )
    return interrupts.interrupt_resolve(
        tenant_id=principal.read_tenant,
        owner=principal.read_user,
        run_id=args.run_id,
        interrupt_id=args.interrupt_id,
        reply=reply,
    )


async def interruption_resolve(principal: Principal, args: InterruptionResolveArgs) -> dict[str, Any]:
    return await db_call(_resolve)(principal, args)


register(
    McpTool(
        "spawn_run",
        "Start a run of an agent; returns its ids. With wait=true, holds until the run ends (at most "
        "wait_seconds) and returns its final text as `result` and its status.",
        RUNS_CREATE,
        SpawnRunArgs,
        spawn_run,
    ),
    McpTool("get_run", "A run's status, usage and stop reason.", RUNS_READ, RunArgs, get_run),
    McpTool(
        "run_events", "A run's persisted events with seq > from_seq (paged).", RUNS_READ, RunEventsArgs, run_events
    ),
    McpTool("cancel_run", "Cancel a run and its live sub-runs.", RUNS_CREATE, CancelRunArgs, cancel_run),
    McpTool(
        "send_input",
        "Steer a running run, or continue a parked interactive run, with text.",
        RUNS_CREATE,
        SendInputArgs,
        send_input,
    ),
    McpTool(
        "interruption_resolve",
        "Answer (or decline) a run's pending Interruption ask; the run continues with the reply.",
        RUNS_CREATE,
        InterruptionResolveArgs,
        interruption_resolve,
    ),
)
