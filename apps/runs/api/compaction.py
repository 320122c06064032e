"""The manual compaction route (docs/compaction.md).
auth -> schema -> service -> JSON; the rules are apps.runs.compaction.services's."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from ninja import Router

from apps.core.errors import Invalid
from apps.core.http import openapi_body, parse_body, request_principal
from apps.core.ids import is_ident
from apps.runs.compaction.services import run_compact
from apps.runs.response_schemas import RunCompactQueuedOut
from apps.runs.schemas import RunCompactIn

router = Router(tags=["runs"])


@router.post(
    "/runs/{run_id}/compact",
    response={202: RunCompactQueuedOut},
    openapi_extra=openapi_body(RunCompactIn),
    summary="Compact a run's context at its next iteration (202; 409 ended, 422 compaction disabled)",
)
def runs_compact(request: HttpRequest, run_id: str) -> JsonResponse:
    if not is_ident(run_id):
        raise Invalid("invalid run_id: must match [A-Za-z0-9_-]{1,128}", code="invalid_request")
    data = parse_body(request, RunCompactIn, max_bytes=4096, required=False)
    body = run_compact(
        principal=request_principal(request), run_id=run_id, keep_last_n=data.keep_last_n, keep_first=data.keep_first
    )
    return JsonResponse(body, status=202)
