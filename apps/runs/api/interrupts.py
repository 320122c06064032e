"""Interruption routes (SPEC 2.3): resolve an ask, a run's interrupts, a user's inbox.
auth -> schema -> service/selector -> schema; the rules are apps.runs.interrupts.services'."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router

from apps.core.errors import Invalid
from apps.core.http import openapi_body, parse_body, request_principal
from apps.core.ids import is_ident
from apps.runs import selectors
from apps.runs.interrupts import services as interrupts
from apps.runs.interrupts.presenters import interrupt_out
from apps.runs.response_schemas import InterruptResolvedOut, RunInterruptsOut, UserInterruptsOut
from apps.runs.schemas import InterruptResolveIn

router = Router(tags=["runs"])


def _check_ident(value: str, what: str) -> None:
    if not is_ident(value):
        raise Invalid(f"invalid {what}: must match [A-Za-z0-9_-]{{1,128}}", code="invalid_request")


@router.post(
    "/runs/{run_id}/interrupts/{interrupt_id}/resolve",
    response=InterruptResolvedOut,
    openapi_extra=openapi_body(InterruptResolveIn),
    summary="Answer or decline an Interruption.ask (422 bad reply, 409 not pending, 410 expired)",
)
def interrupts_resolve(request: HttpRequest, run_id: str, interrupt_id: str) -> dict[str, Any]:
    _check_ident(run_id, "run_id")
    _check_ident(interrupt_id, "interrupt_id")
    data = parse_body(request, InterruptResolveIn, max_bytes=1024 * 1024)
    who = request_principal(request)
    reply = interrupts.caller_resolve(
        answer=data.answer, disposition=data.disposition, resolved_by=data.resolved_by, note=data.note, kind=data.kind
    )
    return interrupts.interrupt_resolve(
        tenant_id=who.read_tenant, owner=who.read_user, run_id=run_id, interrupt_id=interrupt_id, reply=reply
    )


@router.get(
    "/runs/{run_id}/interrupts",
    response=RunInterruptsOut,
    summary="A run's interrupts, oldest first (?status=pending|...|all)",
)
def interrupts_of_run(request: HttpRequest, run_id: str, status: str = "") -> dict[str, Any]:
    _check_ident(run_id, "run_id")
    who = request_principal(request)
    run = selectors.run_get(tenant_id=who.read_tenant, run_id=run_id, owner=who.read_user)
    return {
        "run_id": run.id,
        "interrupts": [interrupt_out(i) for i in selectors.interrupts_for_run(run=run, status=status)],
    }


@router.get(
    "/users/{user_id}/interrupts",
    response=UserInterruptsOut,
    summary="A user's interrupt inbox, newest first (?status=pending default)",
)
def interrupts_of_user(request: HttpRequest, user_id: str, status: str = "pending") -> dict[str, Any]:
    _check_ident(user_id, "user_id")
    who = request_principal(request)
    rows = selectors.interrupts_for_user(
        tenant_id=who.read_tenant, user_id=user_id, status=status, reader=who.read_user
    )
    return {"user_id": user_id, "interrupts": [interrupt_out(i) for i in rows]}
