"""/v1/_snapshots (SPEC 2.4): capture, list, get, export, restore, delete.
Behind substrate:admin (the scope gate's `/v1/_*` rule): a snapshot spans
every tenant. Rules live in apps.snapshots.services and selectors."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router

from apps.core.errors import Invalid
from apps.core.http import openapi_body, parse_body
from apps.core.ids import is_ident
from apps.snapshots import presenters, selectors, services
from apps.snapshots.schemas import (
    SnapshotCapturedOut,
    SnapshotCaptureIn,
    SnapshotEnvelopeOut,
    SnapshotListOut,
    SnapshotRestoreIn,
    SnapshotRestoreOut,
    SnapshotWithEnvelopeOut,
)

router = Router(tags=["snapshots"])
CAPTURE_BODY_BYTES = 64 * 1024


def _checked_id(snapshot_id: str) -> str:
    if not is_ident(snapshot_id):
        raise Invalid("snapshot id must match [A-Za-z0-9_-]{1,128}", code="invalid_snapshot_id")
    return snapshot_id


@router.post(
    "/_snapshots",
    response={201: SnapshotCapturedOut},
    openapi_extra=openapi_body(SnapshotCaptureIn),
    summary="Capture the runtime (its parked runs only when paused); 409 runs_not_parked, 413 snapshot_too_large",
)
def snapshots_capture(request: HttpRequest) -> JsonResponse:
    data = parse_body(request, SnapshotCaptureIn, max_bytes=CAPTURE_BODY_BYTES, required=False)
    capture = services.snapshot_take(label=data.label, max_bytes=data.max_bytes)
    return JsonResponse(presenters.snapshot_captured_out(capture), status=201)


@router.get("/_snapshots", response=SnapshotListOut, summary="Stored snapshots, newest first")
def snapshots_list(request: HttpRequest, limit: int = 100, label_contains: str = "") -> dict[str, Any]:
    rows = selectors.snapshot_list(limit=limit, label_contains=label_contains)
    return {"entries": [presenters.snapshot_out(row) for row in rows]}


@router.get(
    "/_snapshots/{snapshot_id}",
    response=SnapshotWithEnvelopeOut,
    summary="A snapshot's metadata and envelope; 404 snapshot_not_found",
)
def snapshots_get(request: HttpRequest, snapshot_id: str) -> HttpResponse:
    row = selectors.snapshot_get(snapshot_id=_checked_id(snapshot_id))
    return HttpResponse(presenters.snapshot_with_envelope(row), content_type="application/json")


@router.get(
    "/_snapshots/{snapshot_id}/export", response=SnapshotEnvelopeOut, summary="The envelope as stored, as a download"
)
def snapshots_export(request: HttpRequest, snapshot_id: str) -> HttpResponse:
    snapshot_id = _checked_id(snapshot_id)
    response = HttpResponse(selectors.snapshot_content(snapshot_id=snapshot_id), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{snapshot_id}.json"'
    return response


@router.post(
    "/_snapshots/{snapshot_id}/restore",
    response=SnapshotRestoreOut,
    openapi_extra=openapi_body(SnapshotRestoreIn),
    summary="Restore (insert-or-ignore) the stored snapshot, or the envelope in `json`",
)
def snapshots_restore(request: HttpRequest, snapshot_id: str) -> dict[str, int]:
    snapshot_id = _checked_id(snapshot_id)
    data = parse_body(request, SnapshotRestoreIn, max_bytes=settings.LOOMCYCLE.max_request_bytes, required=False)
    if data.envelope is not None:
        return services.snapshot_restore(envelope=data.envelope)
    return services.snapshot_restore_stored(snapshot_id=snapshot_id)


@router.delete("/_snapshots/{snapshot_id}", response={204: None}, summary="Delete a stored snapshot")
def snapshots_delete(request: HttpRequest, snapshot_id: str) -> HttpResponse:
    services.snapshot_delete(snapshot_id=_checked_id(snapshot_id))
    return HttpResponse(status=204)
