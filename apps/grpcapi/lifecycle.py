"""Data-lifecycle RPCs: DeleteRunTree (DELETE /v1/runs/{id}), ErasureReport / ErasureExecute
(GET / POST /v1/_erasure) and RetentionOverride (/v1/_retention's no-trace overrides), each
through the route's service (apps.runs.deletion, apps.lifecycle).

DeleteRunTree answers as loomcycle's does: a run that does not exist or is not the caller's
deletes nothing (`deleted_runs: 0`, so a repeat is safe); a tree holding a live run is
FAILED_PRECONDITION; cancel it first. ErasureExecute is a dry run unless `dry_run` is set false."""

from __future__ import annotations

from typing import Any

from apps.core.errors import Invalid, NotFound
from apps.core.http import db_call
from apps.core.types import Principal
from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.rpc import ident, unary
from apps.lifecycle import erasure, policies
from apps.runs import deletion

KEPT = {"gateway.UsageEntry": "usage ledger rows are kept with their run reference cleared"}


def _tree(principal: Principal, run_id: str, session_id: str) -> dict[str, Any]:
    if bool(run_id) == bool(session_id):
        raise Invalid("pass exactly one of run_id and session_id", code="invalid_request")
    if session_id:
        return deletion.session_trees_delete(principal=principal, session_id=ident(session_id, "session_id"))
    try:
        return deletion.run_tree_delete(principal=principal, run_id=ident(run_id, "run_id"))
    except NotFound:
        return {"run_id": run_id, "session_id": "", "deleted_runs": 0, "counts": {}}


def _tier(tier: dict[str, Any]) -> pb.ErasureTier:
    return pb.ErasureTier(counts=tier["counts"], total=tier["total"])


def _residue(residue: dict[str, Any]) -> pb.ErasureResidue:
    return pb.ErasureResidue(**residue)


def _override(entry: dict[str, str]) -> pb.RetentionOverrideEntry:
    return pb.RetentionOverrideEntry(**entry)


def _overrides(principal: Principal, request: pb.RetentionOverrideRequest) -> pb.RetentionOverrideResponse:
    op, tenant = request.op or "list", request.tenant
    if op == "list":
        listed = policies.overrides_list(principal=principal, tenant=tenant)
        return pb.RetentionOverrideResponse(overrides=[_override(o) for o in listed])
    if op == "set":
        row = policies.override_set(principal=principal, agent=request.agent, until=request.until, tenant=tenant)
        return pb.RetentionOverrideResponse(overrides=[_override(row)])
    if op == "clear":
        cleared = policies.override_clear(principal=principal, agent=request.agent, tenant=tenant)
        return pb.RetentionOverrideResponse(cleared=cleared)
    raise Invalid("op must be list, set or clear", code="invalid_op")


def _override_route(request: pb.RetentionOverrideRequest) -> tuple[str, str]:
    return ("GET" if request.op in ("", "list") else "PUT", "/v1/_retention")


class LifecycleRpcs:
    @unary(("DELETE", "/v1/runs/x"))
    async def DeleteRunTree(self, request: pb.DeleteRunTreeRequest, principal: Principal) -> pb.DeleteRunTreeResult:
        out = await db_call(_tree)(principal, request.run_id, request.session_id)
        return pb.DeleteRunTreeResult(
            run_id=out["run_id"],
            session_id=out["session_id"],
            deleted_runs=out["deleted_runs"],
            counts=out["counts"],
            kept=KEPT,
        )

    @unary(("GET", "/v1/_erasure"))
    async def ErasureReport(self, request: pb.ErasureReportRequest, principal: Principal) -> pb.ErasureReportResponse:
        out = await db_call(erasure.erasure_report)(principal=principal, user_id=request.subject)
        return pb.ErasureReportResponse(
            tenant=out["tenant"],
            subject=out["subject"],
            tier1_covered=_tier(out["tier1_covered"]),
            tier2_uncovered=_tier(out["tier2_uncovered"]),
            tier3_residue=_residue(out["tier3_residue"]),
            notes=out["notes"],
            errors=out["errors"],
        )

    @unary(("POST", "/v1/_erasure"))
    async def ErasureExecute(
        self, request: pb.ErasureExecuteRequest, principal: Principal
    ) -> pb.ErasureExecuteResponse:
        dry_run = request.dry_run if request.HasField("dry_run") else True  # unset: a dry run
        out = await db_call(erasure.erasure_execute)(
            principal=principal, user_id=request.subject, dry_run=dry_run, confirm=request.confirm
        )
        deleted = {} if dry_run else out["deleted"]
        return pb.ErasureExecuteResponse(
            tenant=out["tenant"],
            subject=out["subject"],
            dry_run=dry_run,
            deleted=deleted,
            retained=out.get("retained") or dict(erasure.RETAINED),
            residue=_residue(out.get("residue") or out["tier3_residue"]),
            errors=out["errors"],
            notes=out["notes"],
        )

    @unary(_override_route)
    async def RetentionOverride(
        self, request: pb.RetentionOverrideRequest, principal: Principal
    ) -> pb.RetentionOverrideResponse:
        return await db_call(_overrides)(principal, request)
