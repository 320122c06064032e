"""The console's live tail: GET /v1/runs/{id}/stream's bytes (apps.runs.streams.run_sse),
authenticated by the console session instead of a bearer, for the page's EventSource
(same origin; cookies ride along). Same scope rule, same tenant read, same stream slot
(LOOMCYCLE_MAX_STREAMS_PER_PRINCIPAL) as the REST route: only the credential differs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase

from apps.console.session import asession_principal
from apps.core.errors import ApplicationError
from apps.core.numbers import parse_count
from apps.core.types import Principal
from apps.gateway.fairness.streams import astream_slot
from apps.runs import selectors
from apps.runs.streams import run_sse
from apps.substrate.auth import authorize

if TYPE_CHECKING:
    from apps.runs.models import Run

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _get_run(principal: Principal, run_id: str) -> Run:
    try:
        return selectors.run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    finally:
        connection.close()


async def run_stream(request: HttpRequest, run_id: str) -> HttpResponseBase:
    principal = await asession_principal(request)
    if principal is None:
        return JsonResponse({"code": "unauthorized", "error": "sign in to the console"}, status=401)
    try:
        authorize(principal, "GET", f"/v1/runs/{run_id}/stream")
        run = await sync_to_async(_get_run, thread_sensitive=False)(principal, run_id)
        # EventSource's own reconnect sends Last-Event-ID: it wins over the page's first from_seq.
        start = parse_count(request.headers.get("Last-Event-ID")) or parse_count(request.GET.get("from_seq")) or 0
        slot = await astream_slot(principal)
    except ApplicationError as exc:
        return JsonResponse(exc.body(), status=exc.status, headers=exc.headers)
    stream = run_sse(run, slot, start, live=True)
    return StreamingHttpResponse(stream, content_type="text/event-stream", headers=SSE_HEADERS)
