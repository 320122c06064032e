"""Run tools of loomcycle's MCP surface beyond one run: `spawn_runs` (batch fan-out,
`POST /v1/runs:batch`), `list_runs` (a user's runs, `GET /v1/users/{u}/agents`) and
`compact_run` (`POST /v1/runs/{id}/compact`). Each parses loomcycle's input shape and
calls what its REST route calls (`batch_answer`, `selectors.runs_for_user`,
`run_compact`) with the caller's principal, behind the route's scope.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError

from apps.core.errors import Invalid
from apps.core.http import db_call
from apps.core.ids import IDENT_RE
from apps.core.types import Principal
from apps.mcp.server.tools_runs import RunArgs, RunBodyArgs
from apps.mcp.server.tooltable import Args, McpTool, register
from apps.runs import selectors
from apps.runs.api.batch import batch_answer
from apps.runs.children import fanout
from apps.runs.children.schemas import BatchIn
from apps.runs.compaction.services import run_compact
from apps.runs.presenters import agent_out
from apps.substrate.auth import RUNS_CREATE, RUNS_READ


class SpawnRunsArgs(Args):
    # The 1..32 bound is the batch service's (400 invalid_spawns), as over REST; the schema documents it.
    spawns: list[RunBodyArgs] = Field(
        max_length=1024,
        json_schema_extra={"minItems": 1, "maxItems": fanout.MAX_SPAWNS},
        description="the child runs, each a fresh run (a POST /v1/runs body without session_id)",
    )
    mode: Literal["join", "detach"] = Field(
        default="join", description="join: wait for every child; detach: answer their handles at once"
    )
    timeout_ms: int | None = Field(
        default=None, ge=1, description="join's deadline; a child still running is cancelled"
    )


class ListRunsArgs(Args):
    user_id: str = Field(pattern=f"^{IDENT_RE.pattern}$", description="the end user whose runs to list")
    status: str = Field(
        default="all", description="running (every live state) | completed | failed | cancelled | all, or a comma list"
    )
    limit: int = Field(default=50, ge=1, le=200)


class CompactRunArgs(RunArgs):
    reason: str = Field(default="", max_length=1024, description="a note (not stored)")
    keep_last_n: int | None = Field(default=None, ge=1, le=1000)
    keep_first: bool | None = None


def _batch_body(args: SpawnRunsArgs) -> BatchIn:
    try:
        spawns = [s.model_dump(exclude_unset=True) for s in args.spawns]  # each parsed as REST's spawn body
        return BatchIn.model_validate({"spawns": spawns, "mode": args.mode, "timeout_ms": args.timeout_ms})
    except ValidationError as exc:
        where = ".".join(str(p) for p in exc.errors()[0]["loc"])
        raise Invalid(f"{where}: {exc.errors()[0]['msg']}", code="invalid_body") from exc


async def spawn_runs(principal: Principal, args: SpawnRunsArgs) -> dict[str, Any]:
    """The batch's envelope, as POST /v1/runs:batch answers (its stream slot and wait included)."""
    return await batch_answer(principal, await db_call(_batch_body)(args))


def _list(principal: Principal, args: ListRunsArgs) -> dict[str, Any]:
    runs = selectors.runs_for_user(
        tenant_id=principal.read_tenant, user_id=args.user_id, status=args.status, reader=principal.read_user
    )
    return {"runs": [agent_out(r) for r in runs[: args.limit]]}


async def list_runs(principal: Principal, args: ListRunsArgs) -> dict[str, Any]:
    return await db_call(_list)(principal, args)


def _compact(principal: Principal, args: CompactRunArgs) -> dict[str, Any]:
    run = args.visible(principal)
    return run_compact(principal=principal, run_id=run.id, keep_last_n=args.keep_last_n, keep_first=args.keep_first)


async def compact_run(principal: Principal, args: CompactRunArgs) -> dict[str, Any]:
    return await db_call(_compact)(principal, args)


register(
    McpTool(
        "spawn_runs",
        "Fan out up to 32 fresh runs in one call; mode join (default) waits until all settle and returns an "
        "index-aligned envelope (a child's failure is in its entry), detach returns their handles at once.",
        RUNS_CREATE,
        SpawnRunsArgs,
        spawn_runs,
    ),
    McpTool("list_runs", "A user's runs, newest first: {runs: [...]}.", RUNS_READ, ListRunsArgs, list_runs),
    McpTool(
        "compact_run",
        "Compact a run's context (by run_id or agent_id) at its next iteration; 409 run_terminal when it has "
        "ended, 422 compaction_disabled when its agent does not allow it.",
        RUNS_CREATE,
        CompactRunArgs,
        compact_run,
    ),
)
