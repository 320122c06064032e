"""`usage` and `limits`: what was spent, and the budgets that cap it (issue 37)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import click
from rich.console import Console
from rich.table import Table

from loomcycle_http.cli import output
from loomcycle_http.cli.context import Ctx, pass_ctx
from loomcycle_http.client import LoomcycleError

_SPAN = re.compile(r"^(\d+)([mhdw])$")
_UNIT = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
GROUPS = ("tenant", "user", "agent", "model", "provider", "day")


def since_of(text: str, now: datetime | None = None) -> str:
    """`7d`, `24h`, `30m`, `2w` before now, or an ISO 8601 instant as given."""
    if m := _SPAN.match(text):
        start = (now or datetime.now(UTC)) - timedelta(**{_UNIT[m.group(2)]: int(m.group(1))})
        return start.isoformat()
    try:
        datetime.fromisoformat(text)
    except ValueError as exc:
        raise LoomcycleError(
            f"--since {text!r}: want 7d, 24h, 30m, 2w or an ISO 8601 time", code="invalid_since"
        ) from exc
    return text


@click.command()
@click.option("--by", "by", default="agent", help=f"group by, comma-separated: {', '.join(GROUPS)}")
@click.option("--since", default="30d", show_default=True, help="7d, 24h, 30m, 2w or an ISO 8601 time")
@click.option("--until", default=None, help="an ISO 8601 time (default: now)")
@click.option("--tenant", help="operators: one tenant")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per group")
@click.option("--csv", "as_csv", is_flag=True, help="CSV, as GET /v1/_usage?format=csv answers it")
@pass_ctx
def usage(ctx: Ctx, by: str, since: str, until: str | None, tenant: str | None, as_json: bool, as_csv: bool) -> None:
    """Tokens, calls and cost per group (GET /v1/_usage)."""
    groups = [g.strip() for g in by.split(",") if g.strip()]
    start = since_of(since)
    if as_csv:
        output.write_out(ctx.client.budgets.usage_csv(groups, since=start, until=until, tenant=tenant))
        return
    report = ctx.client.budgets.usage(groups, since=start, until=until, tenant=tenant)
    if as_json:
        for row in report["groups"]:
            output.print_json(row)
        return
    table = Table(box=None, pad_edge=False)
    for column in (*[g.upper() for g in groups], "CALLS", "INPUT", "OUTPUT", "COST_USD"):
        table.add_column(column)
    for row in [*report["groups"], {**report["total"], **dict.fromkeys(groups, "")} | {groups[0]: "TOTAL"}]:
        cells = [str(row.get(g, "")) for g in groups]
        cost = row["cost"] if row["cost"] == "unpriced" else row["cost_usd"]
        table.add_row(*cells, str(row["calls"]), str(row["input_tokens"]), str(row["output_tokens"]), cost)
    Console(highlight=False, width=200).print(table)


@click.group()
def limits() -> None:
    """Token and cost budgets (/v1/_limits)."""


@limits.command("list")
@click.option("--tenant", help="operators: one tenant")
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def limits_list(ctx: Ctx, tenant: str | None, as_json: bool) -> None:
    rows = ctx.client.budgets.limits(tenant=tenant)
    if as_json:
        for row in rows:
            output.print_json(row)
        return
    table = Table(box=None, pad_edge=False)
    for column in ("TENANT", "SCOPE", "SCOPE_ID", "KIND", "WINDOW", "USED", "SOFT", "HARD", "ON_EXCEED", "RESETS"):
        table.add_column(column)
    for r in rows:
        window = f"{r['window_hours']}h" if r["window"] == "hours" else r["window"]
        cells = (r["tenant_id"], r["scope"], r["scope_id"], r["kind"], window, r["used"], r["soft_limit"])
        table.add_row(
            *[str("" if c is None else c) for c in cells], str(r["hard_limit"] or ""), r["on_exceed"], r["resets_at"]
        )
    Console(highlight=False, width=200).print(table)


@limits.command("set")
@click.argument("scope", type=click.Choice(["operator", "tenant", "user", "agent"]))
@click.argument("scope_id", default="")
@click.option("--soft", type=float)
@click.option("--hard", type=float)
@click.option("--kind", default="tokens", type=click.Choice(["tokens", "input_tokens", "output_tokens", "cost_usd"]))
@click.option("--window", default="month", type=click.Choice(["month", "day", "hours"]))
@click.option("--hours", "window_hours", type=int, default=0, help="with --window hours")
@click.option("--on-exceed", default="refuse", type=click.Choice(["refuse", "defer"]))
@click.option("--tenant", "tenant_id", help="operators: the tenant")
@pass_ctx
def limits_set(
    ctx: Ctx,
    scope: str,
    scope_id: str,
    soft: float | None,
    hard: float | None,
    kind: str,
    window: str,
    window_hours: int,
    on_exceed: str,
    tenant_id: str | None,
) -> None:
    """Create or replace one budget; prints it as JSON."""
    fields = {"kind": kind, "window": window, "window_hours": window_hours, "on_exceed": on_exceed}
    row = ctx.client.budgets.set_limit(scope, scope_id, soft_limit=soft, hard_limit=hard, tenant_id=tenant_id, **fields)
    output.print_json(row)


@limits.command("rm")
@click.argument("scope", type=click.Choice(["operator", "tenant", "user", "agent"]))
@click.argument("scope_id", default="")
@click.option("--tenant")
@click.option("--kind")
@click.option("--window")
@pass_ctx
def limits_rm(ctx: Ctx, scope: str, scope_id: str, tenant: str | None, kind: str | None, window: str | None) -> None:
    """Remove budgets of a scope (every kind and window unless named)."""
    deleted = ctx.client.budgets.delete_limit(scope, scope_id, tenant=tenant, kind=kind, window=window)
    output.write_out(f"deleted {deleted}")
