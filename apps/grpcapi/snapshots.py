"""The six snapshot RPCs, as /v1/_snapshots (substrate:admin): capture, list, get, export,
restore, delete through apps.snapshots' services and selectors, the route's schemas for the
inputs. CreateSnapshot's `description` is the snapshot's label, and the live runs a capture of
a running runtime leaves out are named in `warnings`; history sections are not built here, so
`include_history` / `since_ts` are refused by the route's schema, as over HTTP."""

from __future__ import annotations

from typing import Any

from apps.core.errors import Invalid
from apps.core.http import db_call, loads_checked
from apps.core.ids import is_ident
from apps.core.types import Principal
from apps.grpcapi.convert import timestamp
from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.rpc import parsed, unary
from apps.snapshots import selectors, services
from apps.snapshots.models import Snapshot
from apps.snapshots.schemas import SnapshotCaptureIn, SnapshotRestoreIn


def _id(snapshot_id: str) -> str:
    if not is_ident(snapshot_id):
        raise Invalid("snapshot id must match [A-Za-z0-9_-]{1,128}", code="invalid_snapshot_id")
    return snapshot_id


def _descriptor(row: Snapshot) -> pb.SnapshotDescriptor:
    return pb.SnapshotDescriptor(
        snapshot_id=row.id,
        created_at=timestamp(row.created_at),
        size_bytes=row.byte_size,
        description=row.label,
        format_version=row.schema_version,
    )


def _capture_body(request: pb.CreateSnapshotRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"label": request.description}
    if request.include_history:
        body["include_history"] = True
    if request.HasField("since_ts"):
        body["include_history_since"] = request.since_ts.ToJsonString()
    if request.max_bytes:
        body["max_bytes"] = request.max_bytes
    return body


def _restore(request: pb.RestoreSnapshotRequest) -> dict[str, int]:
    body: dict[str, Any] = {"include_history": True} if request.include_history else {}
    if request.raw_json:
        body["json"] = loads_checked(request.raw_json)
    data = parsed(SnapshotRestoreIn, body)
    if data.envelope is not None:
        return services.snapshot_restore(envelope=data.envelope)
    return services.snapshot_restore_stored(snapshot_id=_id(request.snapshot_id))


def _restored(out: dict[str, int]) -> pb.RestoreSnapshotResponse:
    """The service's counters: the ones loomcycle names in their fields, every one in `restored`."""
    reply = pb.RestoreSnapshotResponse()
    known = {f.name for f in pb.RestoreSnapshotResponse.DESCRIPTOR.fields if f.type == f.TYPE_INT32}
    for name, count in out.items():
        if isinstance(count, int):
            reply.restored[name] = count
            if name in known:
                setattr(reply, name, count)
    return reply


class SnapshotRpcs:
    @unary(("POST", "/v1/_snapshots"))
    async def CreateSnapshot(self, request: pb.CreateSnapshotRequest, principal: Principal) -> pb.SnapshotDescriptor:
        data = parsed(SnapshotCaptureIn, _capture_body(request))
        capture = await db_call(services.snapshot_take)(label=data.label, max_bytes=data.max_bytes)
        reply = _descriptor(capture.row)
        if capture.runs_left_out:  # what POST /v1/_snapshots answers as runs_left_out, as loomcycle's warnings
            reply.warnings.append(
                f"runtime {capture.runtime_state}: {capture.runs_left_out} live run(s) not carried "
                f"({capture.runs_captured} carried); pause first to carry runs with their state"
            )
        return reply

    @unary(("GET", "/v1/_snapshots"))
    async def ListSnapshots(self, request: pb.ListSnapshotsRequest, principal: Principal) -> pb.ListSnapshotsResponse:
        rows = await db_call(selectors.snapshot_list)()
        return pb.ListSnapshotsResponse(snapshots=[_descriptor(r) for r in rows])

    @unary(("GET", "/v1/_snapshots/x"))
    async def GetSnapshot(self, request: pb.GetSnapshotRequest, principal: Principal) -> pb.SnapshotEnvelope:
        row = await db_call(selectors.snapshot_get)(snapshot_id=_id(request.snapshot_id))
        return pb.SnapshotEnvelope(
            snapshot_id=row.id,
            created_at=timestamp(row.created_at),
            description=row.label,
            format_version=row.schema_version,
            size_bytes=row.byte_size,
            json_content=row.content.encode(),
        )

    @unary(("GET", "/v1/_snapshots/x/export"))
    async def ExportSnapshot(
        self, request: pb.ExportSnapshotRequest, principal: Principal
    ) -> pb.ExportSnapshotResponse:
        row = await db_call(selectors.snapshot_get)(snapshot_id=_id(request.snapshot_id))
        raw = row.content.encode()
        return pb.ExportSnapshotResponse(snapshot_id=row.id, checksum=row.checksum, size_bytes=len(raw), raw_json=raw)

    @unary(("POST", "/v1/_snapshots/x/restore"))
    async def RestoreSnapshot(
        self, request: pb.RestoreSnapshotRequest, principal: Principal
    ) -> pb.RestoreSnapshotResponse:
        return _restored(await db_call(_restore)(request))

    @unary(("DELETE", "/v1/_snapshots/x"))
    async def DeleteSnapshot(
        self, request: pb.DeleteSnapshotRequest, principal: Principal
    ) -> pb.DeleteSnapshotResponse:
        snapshot_id = _id(request.snapshot_id)
        await db_call(services.snapshot_delete)(snapshot_id=snapshot_id)
        return pb.DeleteSnapshotResponse(deleted=True, snapshot_id=snapshot_id)
