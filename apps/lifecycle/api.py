"""/v1/_retention and /v1/_erasure (docs/api.md; scopes: apps.substrate.auth, SPEC 2.1).
auth -> schema -> service -> JSON; the rules are apps.lifecycle.policies's and erasure's."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router

from apps.core.http import openapi_body, parse_body, request_principal
from apps.lifecycle import erasure, policies
from apps.lifecycle.schemas import ErasureIn, ErasureOut, RetentionOut, RetentionSetIn

router = Router(tags=["lifecycle"])


@router.get("/_retention", response=RetentionOut, summary="Retention ages and no-trace overrides of the tenant")
def retention_get(request: HttpRequest, tenant: str = "") -> dict[str, Any]:
    return policies.retention_report(principal=request_principal(request), tenant=tenant)


@router.put(
    "/_retention",
    response=RetentionOut,
    openapi_extra=openapi_body(RetentionSetIn),
    summary="Set the tenant's (or one agent's) retention age in days",
)
def retention_put(request: HttpRequest) -> dict[str, Any]:
    data = parse_body(request, RetentionSetIn, max_bytes=4096)
    return policies.retention_set(
        principal=request_principal(request), agent=data.agent, max_age_days=data.max_age_days, tenant=data.tenant
    )


@router.delete("/_retention", response=RetentionOut, summary="Remove an age set over the API (yaml/env apply again)")
def retention_delete(request: HttpRequest, agent: str = "", tenant: str = "") -> dict[str, Any]:
    return policies.retention_unset(principal=request_principal(request), agent=agent, tenant=tenant)


@router.get("/_erasure", response=ErasureOut, summary="What is held about one person (user id) of the tenant")
def erasure_get(request: HttpRequest, subject: str = "") -> dict[str, Any]:
    return erasure.erasure_report(principal=request_principal(request), user_id=subject)


@router.post(
    "/_erasure",
    response=ErasureOut,
    openapi_extra=openapi_body(ErasureIn),
    summary="Erase one person of the tenant (dry run unless dry_run=false and confirm=subject)",
)
def erasure_post(request: HttpRequest) -> dict[str, Any]:
    data = parse_body(request, ErasureIn, max_bytes=4096)
    return erasure.erasure_execute(
        principal=request_principal(request), user_id=data.subject, dry_run=data.dry_run, confirm=data.confirm
    )
