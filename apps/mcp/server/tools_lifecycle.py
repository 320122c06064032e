"""Data-lifecycle tools: `erasure` reports or erases one person (a user id) of the caller's
tenant, as `GET` / `POST /v1/_erasure` do (apps/lifecycle/api.py): the same service
(apps.lifecycle.erasure), the tenant taken from the principal (no argument names it, so another
tenant's person cannot be reached), substrate:tenant as the route. `op: execute` is a dry run
unless `dry_run` is false and `confirm` equals the subject, as over REST and as loomcycle's tool.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from apps.core.http import db_call
from apps.core.types import Principal
from apps.lifecycle import erasure
from apps.mcp.server.tooltable import Args, McpTool, register
from apps.substrate.auth import TENANT


class ErasureArgs(Args):
    subject: str = Field(description="the user id whose footprint to report or erase")
    op: Literal["report", "execute"] = Field(default="report", description="report (read-only) or execute")
    dry_run: bool = Field(default=True, description="execute only; true (the default) deletes nothing")
    confirm: str = Field(default="", description="execute only; must equal subject when dry_run is false")


def _erasure(principal: Principal, args: ErasureArgs) -> dict[str, Any]:
    if args.op == "report":
        return erasure.erasure_report(principal=principal, user_id=args.subject)
    return erasure.erasure_execute(
        principal=principal, user_id=args.subject, dry_run=args.dry_run, confirm=args.confirm
    )


async def erasure_tool(principal: Principal, args: ErasureArgs) -> dict[str, Any]:
    return await db_call(_erasure)(principal, args)


DESCRIPTION = (
    "Report or erase everything this deployment holds about one subject (a user id) of your tenant. "
    "op=report (default) is read-only: counts per table (tier1_covered), what is reached only through "
    "their runs (tier2_uncovered), and notes. op=execute removes it, in bounded batches, and answers the "
    "audit row; it defaults to a dry run: pass dry_run:false and confirm equal to subject to delete "
    "(irreversible). The usage ledger is kept with the person's references cleared. The tenant is "
    "your credentials', never an argument."
)

register(McpTool("erasure", DESCRIPTION, TENANT, ErasureArgs, erasure_tool))
