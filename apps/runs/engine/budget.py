"""The engine's two calls into the spend gate (apps.core.spend; issue 37): before
a step's provider call, reserve on the budgets in scope (a run over a hard limit
stops here, or parks `waiting_budget` when the limit defers); after its commit,
settle what the step spent. Children carry their root's tenant and user, so they
spend their root's budgets; agent limits count the run's own agent."""

from __future__ import annotations

from django.conf import settings
from django.db import connection

from apps.core import spend
from apps.gateway.usage_metrics import count_usage
from apps.runs.engine.write import Next, StepWrite, finish
from apps.runs.models import RunStatus
from apps.runs.store import ClaimedRun

STOP_REASON = "token_limit_exceeded"


def gate(run: ClaimedRun, write: StepWrite) -> StepWrite | None:
    """None: the call may go on (with any new soft-limit events in `write`). Else the step's write:
    the run stopped with the hard limit's event, or parked until the budget frees."""
    g = spend.guard()
    if g is None:
        return None
    # The claim read the limits' generation: unchanged, the guard need not read the limits again.
    verdict = g.hold(key=f"run:{run.id}", step=run.step, spender=spender_of(run), generation=run.limits_generation)
    write.budget_held = verdict.held
    if not verdict.held:
        return None
    crossings = [*verdict.soft, *([verdict.hard] if verdict.hard else [])]
    write.events.extend(c.event() for c in g.notices(run_id=run.id, crossings=crossings))
    if verdict.hard is None:
        return None
    if verdict.hard.on_exceed == "defer" and verdict.hard.resume_at is not None:
        write.events.append({"type": "waiting_budget", "resume_at": verdict.hard.resume_at.isoformat()})
        write.budget_wait = verdict.hard
        write.status, write.next, write.advance = RunStatus.WAITING_BUDGET, Next.PARK, False
        return write
    return finish(write, STOP_REASON)


def settle(run: ClaimedRun, write: StepWrite) -> None:
    """After the step's commit: its ledger rows become its budgets' spend, and its spend
    counters join the iteration's metrics batch (flushed with the others, no I/O here)."""
    if settings.LOOMCYCLE.metrics_enabled:
        for entry in write.ledger:
            count_usage(write.metrics, tenant_id=run.tenant_id, entry=entry)
    g = spend.guard()
    # A run going on settles at its next step's gate, in that gate's transaction (apps.budgets.hot):
    # only a park or an end settles here.
    if g is None or not write.budget_held or write.next == Next.REQUEUE:
        return
    try:
        g.settle_run(run_id=run.id)
    finally:
        connection.close()


def spender_of(run: ClaimedRun) -> spend.Spender:
    return spend.Spender(tenant_id=run.tenant_id, user_id=run.user_id, agent=run.agent_name)
