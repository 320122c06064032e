"""`POST /v1/_webhooks/{name}` and `/v1/_webhooks/{tenant}/{name}` (SPEC 2.10):
plain Django async views, outside the NinjaAPI and its bearer gate, mounted
by loomcycle_project/urls.py only when LOOMCYCLE_WEBHOOKS_ENABLED=1. The
pipeline runs on a worker thread (apps.triggers.webhooks.receive); a sync
delivery then waits on the event loop (waits.py), holding no thread."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps.core.errors import ApplicationError
from apps.core.http import db_call
from apps.core.numbers import parse_count
from apps.triggers.webhooks.errors import SyncTimeout
from apps.triggers.webhooks.models import Verdict
from apps.triggers.webhooks.receive import Accepted, Incoming, webhook_receive
from apps.triggers.webhooks.services import delivery_record
from apps.triggers.webhooks.waits import run_terminal_status


def _error(exc: ApplicationError) -> HttpResponse:
    response = JsonResponse(exc.body(), status=exc.status)
    for key, value in exc.headers.items():
        response[key] = value
    return response


def _content_length(request: HttpRequest) -> int | None:
    return parse_count(str(request.META.get("CONTENT_LENGTH") or ""), max_digits=18)


def _incoming(request: HttpRequest, tenant: str, name: str) -> Incoming:
    return Incoming(
        tenant=tenant,
        name=name,
        headers={k.lower(): v for k, v in request.headers.items()},
        content_length=_content_length(request),
        read=request.read,
        sync=request.GET.get("sync", "").lower() in ("1", "true"),
    )


def _answer(accepted: Accepted) -> dict[str, Any]:
    d = accepted.delivered
    out: dict[str, Any] = {"webhook_name": accepted.hook.name, "delivery_id": d.delivery_id}
    if d.run_id:
        out["run_id"] = d.run_id
    if d.channel:
        out["channel"] = d.channel
    if d.deduped:
        out["deduped"] = "true"
    return out


async def _sync_answer(accepted: Accepted) -> HttpResponse:
    d = accepted.delivered
    status = await run_terminal_status(d.run_id, accepted.sync_timeout_ms / 1000)
    if status is None:
        hook = accepted.hook
        await db_call(delivery_record)(
            owner=hook.owner, name=hook.name, delivery_id=d.delivery_id, verdict=Verdict.TIMEOUT, run_id=d.run_id
        )
        exc = SyncTimeout(
            f"run {d.run_id} did not finish within {accepted.sync_timeout_ms} ms", details={"run_id": d.run_id}
        )
        return _error(exc)
    return JsonResponse({**_answer(accepted), "agent_id": d.agent_id, "status": status}, status=200)


@csrf_exempt
async def webhook_receive_view(request: HttpRequest, name: str, tenant: str = "") -> HttpResponse:
    if request.method != "POST":
        return JsonResponse({"code": "method_not_allowed", "error": "use POST", "details": {}}, status=405)
    try:
        accepted = await db_call(webhook_receive)(_incoming(request, tenant, name))
    except ApplicationError as exc:
        return _error(exc)
    if accepted.delivered.deduped:
        return JsonResponse(_answer(accepted), status=200)
    if accepted.sync_timeout_ms:
        return await _sync_answer(accepted)
    return JsonResponse(_answer(accepted), status=202)
