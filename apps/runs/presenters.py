"""Run wire shapes: the agent/run status object of SPEC 2.3 (`GET /v1/agents/{id}`,
`GET /v1/runs/{id}`, a user's agent list). Pure functions of a `Run` row."""

from __future__ import annotations

from typing import Any

from apps.core import spend
from apps.core.timefmt import ts
from apps.runs.children.resident import state_of
from apps.runs.models import PARKED, RUNNABLE, ResidentChild, Run, RunStatus

_AWAITED = {
    RunStatus.WAITING_CHANNEL: "channel",
    RunStatus.AWAITING_INTERRUPT: "interrupted",
    RunStatus.AWAITING_INPUT: "input",
    RunStatus.WAITING_CHILDREN: "children",
    RunStatus.PAUSED: "paused",
    RunStatus.WAITING_BUDGET: "budget",
}


def agent_out(run: Run) -> dict[str, Any]:
    live = run.status in RUNNABLE or run.status in PARKED
    return {
        "agent_id": run.agent_id,
        "run_id": run.id,
        "session_id": run.session_id,
        "agent": run.agent_name,
        "user_id": run.user_id,
        "parent_agent_id": run.parent.agent_id if run.parent else None,
        "parent_context": run.parent_context,
        "status": "running" if live else run.status,
        "state": run.status,
        "step": run.step,
        "started_at": ts(run.started_at or run.created_at),
        "completed_at": ts(run.completed_at),
        "stop_reason": run.stop_reason,
        "error": run.error,
        "usage": run.usage,
        "last_heartbeat_at": ts(run.last_heartbeat_at),
        "live": live,
        "interactive": run.interactive,
        "awaited_state": _AWAITED.get(RunStatus(run.status), ""),
        "awaited_on": _budget_resume(run) if run.status == RunStatus.WAITING_BUDGET else "",
        **_resident(run),
        "agent_def_id": run.agent_def_id,
        "content_sha256": run.agent_def_sha256,
        "last_seq": run.last_seq,
        "forked_from_run": run.forked_from_run_id,
        "forked_at_step": run.forked_at_step,
        "retention": run.retention,  # "" or "no_trace" (apps.runs.deletion)
    }


def _budget_resume(run: Run) -> str:
    """A run deferred over a budget: when its window resets (apps.core.spend), "" once it has freed."""
    g = spend.guard()
    hard = g.admit(spend.Spender(run.tenant_id, run.user_id, run.agent_name)).hard if g else None
    return "" if hard is None or hard.resume_at is None else ts(hard.resume_at) or ""


def _resident(run: Run) -> dict[str, Any]:
    """Whether the run is a resident child (Agent op=open) and its state as its parent sees it
    (idle | running | closed; "" for any other run). The selectors join the row in."""
    try:
        row = run.resident
    except ResidentChild.DoesNotExist:
        return {"resident": False, "resident_state": ""}
    return {"resident": True, "resident_state": state_of(row, run.status, run.pending_inputs).value}
