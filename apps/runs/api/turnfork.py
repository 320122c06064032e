"""Turn-cancel and fork routes (SPEC 2.3 `POST /v1/runs/{id}/cancel`; `POST /v1/runs/{id}/fork`, beyond
loomcycle). auth -> schema -> service -> schema; the rules are apps.runs.engine.turncancel's and apps.runs.fork's."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from ninja import Router

from apps.core.errors import Invalid
from apps.core.http import openapi_body, parse_body, request_principal
from apps.core.ids import is_ident
from apps.runs import fork
from apps.runs.engine import turncancel
from apps.runs.response_schemas import RunForkedOut, TurnCancelledOut
from apps.runs.schemas import ForkIn, TurnCancelIn

router = Router(tags=["runs"])


def _check_ident(value: str, what: str) -> None:
    if not is_ident(value):
        raise Invalid(f"invalid {what}: must match [A-Za-z0-9_-]{{1,128}}", code="invalid_request")


@router.post(
    "/runs/{run_id}/cancel",
    response=TurnCancelledOut,
    openapi_extra=openapi_body(TurnCancelIn),
    summary="Turn-cancel an interactive run: stop its current turn, re-park it (409 not_interactive / not_mid_turn)",
)
def runs_turn_cancel(request: HttpRequest, run_id: str) -> dict[str, Any]:
    _check_ident(run_id, "run_id")
    data = parse_body(request, TurnCancelIn, max_bytes=64 * 1024, required=False)
    return turncancel.run_turn_cancel(principal=request_principal(request), run_id=run_id, reason=data.reason)


@router.post(
    "/runs/{run_id}/fork",
    response={201: RunForkedOut},
    openapi_extra=openapi_body(ForkIn),
    summary="Start a new run in a new session from this run's transcript through step from_step",
)
def runs_fork(request: HttpRequest, run_id: str) -> JsonResponse:
    _check_ident(run_id, "run_id")
    data = parse_body(request, ForkIn, max_bytes=1024 * 1024 + 4096)
    run = fork.run_fork(
        principal=request_principal(request),
        run_id=run_id,
        request=fork.ForkRequest(
            from_step=data.from_step,
            agent=data.agent,
            prompt=data.prompt,
            interactive=data.interactive,
            agent_id=data.agent_id,
        ),
    )
    body = {
        "agent_id": run.agent_id,
        "run_id": run.id,
        "session_id": run.session_id,
        "status": run.status,
        "forked_from_run": run.forked_from_run_id,
        "forked_at_step": run.forked_at_step,
    }
    return JsonResponse(body, status=201)
