"""The run verbs A2A calls, each the service its REST route calls (apps.runs), run in a
worker thread by the handler: start a task (POST /v1/runs), answer one that waits
(POST /v1/runs/{id}/input, or .../interrupts/{id}/resolve), cancel it, read it. Each hands
its database connection back, as every sync call from the event loop here does."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from django.db import connection

from apps.a2a.presenters import RunView
from apps.core.errors import Conflict
from apps.core.types import Principal
from apps.runs import selectors, services
from apps.runs.interrupts import services as interrupts
from apps.runs.models import TERMINAL, Run, RunStatus
from apps.runs.prompt import Segment

P = ParamSpec("P")
T = TypeVar("T")


def closing(fn: Callable[P, T]) -> Callable[P, T]:
    @wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connection.close()

    return call


def _view(run: Run) -> RunView:
    question = ""
    if run.status == RunStatus.AWAITING_INTERRUPT:
        pending = selectors.interrupts_for_run(run=run, status="pending")
        question = pending[0].question if pending else ""
    return RunView(
        run_id=run.id,
        session_id=run.session_id,
        status=run.status,
        last_seq=run.last_seq,
        agent_name=run.agent_name,
        final_text=selectors.run_final_text(run_id=run.id),
        error=run.error or run.cancel_reason or run.stop_reason,
        question=question,
    )


def visible(principal: Principal, run_id: str) -> Run:
    """The run as the caller may see it (404 `not_found` for another tenant's, as GET /v1/runs/{id})."""
    return selectors.run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)


@closing
def run_view(principal: Principal, run_id: str) -> RunView:
    return _view(visible(principal, run_id))


@closing
def task_start(principal: Principal, *, agent: str, text: str, session_id: str | None, metadata: dict[str, Any]) -> Run:
    data = services.RunCreate(
        agent=agent,
        segments=[Segment(role="user", type="trusted-text", text=text)],
        session_id=session_id,
        metadata=metadata,
    )
    return services.run_create(principal=principal, data=data)


@closing
def task_answer(principal: Principal, run_id: str, text: str) -> Run:
    """A follow-up message on a task: the answer to the question it waits on, or input it reads next."""
    run = visible(principal, run_id)
    if run.status in TERMINAL:
        raise Conflict(f"task {run.id} is {run.status}: an ended task takes no message", code="task_ended")
    if run.status == RunStatus.AWAITING_INTERRUPT:
        pending = selectors.interrupts_for_run(run=run, status="pending")
        if pending:
            reply = interrupts.caller_resolve(
                answer=text, disposition="answer", resolved_by=f"a2a:{principal.subject}"[:160], note="", kind=None
            )
            interrupts.interrupt_resolve(
                tenant_id=principal.read_tenant,
                owner=principal.read_user,
                run_id=run.id,
                interrupt_id=pending[0].id,
                reply=reply,
            )
            return run
    services.run_input(principal=principal, run_id=run.id, text=text)
    return run


@closing
def task_cancel(principal: Principal, run_id: str) -> dict[str, Any]:
    return services.run_cancel(principal=principal, run_id=run_id, reason="cancelled over A2A")


@closing
def run_view_unscoped(run_id: str) -> RunView:
    """A run the caller was already found to see (its stream follows it after the check)."""
    return _view(selectors.run_get(tenant_id=None, run_id=run_id))


@closing
def run_state(run_id: str) -> tuple[str, int]:
    """(status, last committed seq) of a run the caller was already found to see."""
    return selectors.run_status_seq(run_id=run_id) or ("", 0)


@closing
def run_last_seq(principal: Principal, run_id: str) -> int:
    return visible(principal, run_id).last_seq
