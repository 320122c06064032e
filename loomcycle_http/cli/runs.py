"""`ps`, `logs`, `send`, `cancel`, `pause`, `resume`: runs that already exist, and the runtime."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from loomcycle_http.cli import output
from loomcycle_http.cli.context import Ctx, pass_ctx
from loomcycle_http.client import Event


@click.command()
@click.option("--all", "show_all", is_flag=True, help="finished runs too")
@click.option("--agent", help="only runs of this agent")
@click.option("--tenant", help="admins: only this tenant's runs")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per run")
@pass_ctx
def ps(ctx: Ctx, show_all: bool, agent: str | None, tenant: str | None, as_json: bool) -> None:
    """Live runs (newest first): agent, state, step, age, tokens."""
    runs = ctx.client.runs.list(status="all" if show_all else "running", agent=agent, tenant=tenant)
    if as_json:
        for row in runs:
            output.print_json(row)
        return
    table = Table(box=None, pad_edge=False)
    for column in ("RUN", "AGENT_ID", "AGENT", "STATE", "STEP", "AGE", "TOKENS"):
        table.add_column(column)
    for row in runs:
        cells = (row["run_id"], row["agent_id"], row["agent"], row["state"], str(row["step"]))
        table.add_row(*cells, output.age(row.get("started_at")), str(output.tokens(row.get("usage"))))
    Console(highlight=False, width=200).print(table)


def _show(event: Event, as_json: bool) -> None:
    output.write_out(event.to_json() if as_json else f"{event.seq or '-':>5} {event.type:<14} {output.summary(event)}")


@click.command()
@click.argument("run_ref", metavar="RUN")
@click.option("--follow", "-f", is_flag=True, help="follow the run live until it ends (reattaching after drops)")
@click.option("--from-seq", type=int, default=0, help="start after this seq")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per event")
@pass_ctx
def logs(ctx: Ctx, run_ref: str, follow: bool, from_seq: int, as_json: bool) -> None:
    """A run's events (RUN is its run_id or agent_id)."""
    run_id = str(ctx.client.runs.resolve(run_ref)["run_id"])
    events = (
        ctx.client.runs.stream(run_id, from_seq=from_seq, live=False)  # a log: committed events, each whole
        if follow
        else ctx.client.runs.events(run_id, from_seq=from_seq)
    )
    for event in events:
        _show(event, as_json)


@click.command()
@click.argument("run_ref", metavar="RUN")
@click.argument("text")
@pass_ctx
def send(ctx: Ctx, run_ref: str, text: str) -> None:
    """Send TEXT to a run: steer it, or answer it when it awaits input (`-` reads stdin)."""
    if text == "-":
        text = sys.stdin.read()
    run_id = str(ctx.client.runs.resolve(run_ref)["run_id"])
    ctx.client.runs.input(run_id, text)
    output.note(f"delivered to {run_id}")


@click.command()
@click.argument("run_ref", metavar="RUN")
@click.option("--reason", default="cancelled by loomcycle cancel")
@click.option("--turn", is_flag=True, help="stop only the current turn of an interactive run; it re-parks for input")
@pass_ctx
def cancel(ctx: Ctx, run_ref: str, reason: str, turn: bool) -> None:
    """Cancel a run and its live sub-runs (--turn: only an interactive run's current turn)."""
    run = ctx.client.runs.resolve(run_ref)
    if turn:
        ctx.client.runs.cancel_turn(str(run["run_id"]), reason=reason)
        output.write_out(f"turn of {run['run_id']} cancelled; it re-parks for input")
        return
    answer = ctx.client.runs.cancel(str(run["agent_id"]), reason=reason)
    if answer.get("cancelled"):
        output.write_out(f"cancelled {run['run_id']}")
    else:
        output.write_out(f"{run['run_id']} had already ended ({answer.get('status')})")


@click.command()
@click.option("--timeout-ms", type=int, help="how long to wait for in-flight iterations to park")
@pass_ctx
def pause(ctx: Ctx, timeout_ms: int | None) -> None:
    """Pause the runtime: every run parks at its next boundary; new runs are refused."""
    with output.spinner("pausing: waiting for runs to park", enabled=True):
        answer = ctx.client.runtime.pause(timeout_ms)
    output.print_json(answer)


@click.command()
@pass_ctx
def resume(ctx: Ctx) -> None:
    """Resume a paused runtime."""
    output.print_json(ctx.client.runtime.resume())
