"""Memory admin REST (SPEC 2.8): keys of one (scope, scope_id) in the caller's tenant.

The tenant is always the credential's: another tenant's key is simply absent
(404 on GET, nothing listed). Tenant and global scopes ignore the path's
scope_id. Global rows belong to the deployment's tenant (""): every tenant
reads them, only a principal of that tenant writes them.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router
from pydantic import BaseModel, ConfigDict

from apps.core.errors import Invalid, NotFound
from apps.core.http import db_call, openapi_body, parse_body, request_principal
from apps.core.numbers import parse_count
from apps.core.types import Principal
from apps.memory import presenters, selectors, services
from apps.memory.models import MemoryScope

router = Router(tags=["memory"])
ADMIN_BODY_BYTES = 1024 * 1024
MAX_TTL_SECONDS = 10 * 365 * 86400
_PREFIX = "/_memory/scopes/{scope}/{scope_id}/keys"


class MemoryPutIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: Any = None
    embed: Any = None
    ttl_seconds: Any = None
    embed_text: Any = None


class MemorySearchIn(BaseModel):
    # Documented as selectors.slot_for checks it: agent and user scopes need a scope_id.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "if": {"properties": {"scope": {"enum": ["agent", "user"]}}, "required": ["scope"]},
            "then": {"properties": {"scope_id": {"minLength": 1}}, "required": ["scope_id"]},
        },
    )

    query: str
    scope: str
    scope_id: str = ""
    top_k: int = 10
    rank: dict[str, Any] | None = None
    dedup: dict[str, Any] | None = None


def _check_key(key: str) -> None:
    if not key or len(key) > selectors.MAX_KEY_CHARS:
        raise Invalid(f"key must be 1..{selectors.MAX_KEY_CHARS} characters", code="invalid_request")


def _put(principal: Principal, scope: str, scope_id: str, key: str, body: MemoryPutIn, embed_q: bool) -> dict[str, Any]:
    slot = selectors.slot_for(principal, scope, scope_id, write=True)
    _check_key(key)
    if "value" not in body.model_fields_set or body.value is None:
        raise Invalid("value is required (any JSON value but null)", code="missing_value")
    ttl = body.ttl_seconds
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= MAX_TTL_SECONDS):
        raise Invalid(f"ttl_seconds must be an integer between 1 and {MAX_TTL_SECONDS}", code="invalid_value")
    if body.embed is not None and not isinstance(body.embed, bool):
        raise Invalid("embed must be a boolean", code="invalid_value")
    if body.embed_text is not None and not isinstance(body.embed_text, str):
        raise Invalid("embed_text must be a string", code="invalid_value")
    result = services.memory_set(
        slot=slot,
        key=key,
        value=body.value,
        ttl_seconds=ttl,
        embed=body.embed is True or embed_q,
        embed_text=body.embed_text,
        on_behalf_of=principal,
    )
    out: dict[str, Any] = {"scope": scope, "scope_id": slot.scope_id, "key": key, "embedded": result.embedded}
    if result.embed_warning:
        out["embed_warning"] = result.embed_warning
    return out


def _get(principal: Principal, scope: str, scope_id: str, key: str) -> dict[str, Any]:
    slot = selectors.slot_for(principal, scope, scope_id, write=False)
    row = selectors.memory_get(slot=slot, key=key)
    if row is None:
        raise NotFound(f"no key {key!r} in {scope} memory", code="not_found")
    return {"scope": scope, "scope_id": slot.scope_id, "entry": presenters.entry_rest(row)}


def _delete(principal: Principal, scope: str, scope_id: str, key: str) -> None:
    services.memory_delete(slot=selectors.slot_for(principal, scope, scope_id, write=True), key=key)


def _list(principal: Principal, scope: str, scope_id: str, prefix: str, limit_raw: str) -> dict[str, Any]:
    slot = selectors.slot_for(principal, scope, scope_id, write=False)
    limit = parse_count(limit_raw)
    if limit is None or not 1 <= limit <= 1000:
        raise Invalid("limit must be an integer between 1 and 1000", code="invalid_limit")
    rows, truncated = selectors.memory_list(slot=slot, prefix=prefix, limit=limit)
    entries = [presenters.entry_rest(r) for r in rows]
    return {"scope": scope, "scope_id": slot.scope_id, "entries": entries, "truncated": truncated}


def _search(principal: Principal, body: MemorySearchIn) -> dict[str, Any]:
    slot = selectors.slot_for(principal, body.scope, body.scope_id, write=False)
    if not body.query.strip() or not 1 <= body.top_k <= 50:
        raise Invalid("query must be non-empty and top_k between 1 and 50", code="invalid_body")
    try:
        rank, dedup = selectors.search_options({"rank": body.rank, "dedup": body.dedup})
    except selectors.BadSearchOptions as exc:
        raise Invalid(str(exc), code="invalid_body") from exc
    found = selectors.memory_search(
        slot=slot, query=body.query, top_k=body.top_k, rank=rank, dedup=dedup, on_behalf_of=principal
    )
    return {"scope": body.scope, "scope_id": slot.scope_id, **presenters.search_out(found)}


@router.get("/_memory/scopes", operation_id="memory_scopes", summary="Memory scopes")
async def memory_scopes(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"scopes": list(MemoryScope.values)})


@router.get(_PREFIX, operation_id="memory_keys_list", summary="List live keys (prefix, limit 200 default, max 1000)")
async def memory_keys_list(request: HttpRequest, scope: str, scope_id: str) -> JsonResponse:
    prefix, limit = request.GET.get("prefix", ""), request.GET.get("limit", "200")
    return JsonResponse(await db_call(_list)(request_principal(request), scope, scope_id, prefix, limit))


@router.get(_PREFIX + "/{path:key}", operation_id="memory_key_get", summary="One live key; 404 not_found")
async def memory_key_get(request: HttpRequest, scope: str, scope_id: str, key: str) -> JsonResponse:
    return JsonResponse(await db_call(_get)(request_principal(request), scope, scope_id, key))


@router.put(
    _PREFIX + "/{path:key}",
    operation_id="memory_key_put",
    summary="Write a key: {value, embed?, ttl_seconds?}; 413 memory_value_too_large / memory_quota_exceeded",
    openapi_extra=openapi_body(MemoryPutIn),
)
async def memory_key_put(request: HttpRequest, scope: str, scope_id: str, key: str) -> JsonResponse:
    body = parse_body(request, MemoryPutIn, max_bytes=ADMIN_BODY_BYTES)
    embed_q = request.GET.get("embed", "").lower() in ("1", "true")
    return JsonResponse(await db_call(_put)(request_principal(request), scope, scope_id, key, body, embed_q))


@router.delete(_PREFIX + "/{path:key}", operation_id="memory_key_delete", summary="Delete a key (always 204)")
async def memory_key_delete(request: HttpRequest, scope: str, scope_id: str, key: str) -> HttpResponse:
    await db_call(_delete)(request_principal(request), scope, scope_id, key)
    return HttpResponse(status=204)


@router.post(
    "/_memory/search",
    operation_id="memory_search",
    summary="Vector search {query, scope, scope_id, top_k, rank, dedup}",
    openapi_extra=openapi_body(MemorySearchIn, enums={"scope": MemoryScope.values}),
)
async def memory_search(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, MemorySearchIn, max_bytes=ADMIN_BODY_BYTES)
    return JsonResponse(await db_call(_search)(request_principal(request), body))
