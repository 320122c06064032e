"""Memory admin REST (SPEC 2.8): keys of one (scope, scope_id) in the caller's tenant.
Each route parses and calls apps.memory.keyops, the verbs gRPC's Memory RPC calls too
(which tenant, which keys: see there)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router

from apps.core.http import db_call, openapi_body, parse_body, request_principal
from apps.memory import keyops
from apps.memory.models import MemoryScope
from apps.memory.schemas import MemoryKeyOut, MemoryKeysOut, MemoryPutOut, MemoryScopesOut, MemorySearchOut

router = Router(tags=["memory"])
ADMIN_BODY_BYTES = 1024 * 1024
_PREFIX = "/_memory/scopes/{scope}/{scope_id}/keys"


@router.get("/_memory/scopes", response=MemoryScopesOut, operation_id="memory_scopes", summary="Memory scopes")
async def memory_scopes(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"scopes": list(MemoryScope.values)})


@router.get(
    _PREFIX,
    response=MemoryKeysOut,
    operation_id="memory_keys_list",
    summary="List live keys (prefix, limit 200 default, max 1000)",
)
async def memory_keys_list(request: HttpRequest, scope: str, scope_id: str) -> JsonResponse:
    prefix, limit = request.GET.get("prefix", ""), request.GET.get("limit", "200")
    return JsonResponse(await db_call(keyops.keys_list)(request_principal(request), scope, scope_id, prefix, limit))


@router.get(
    _PREFIX + "/{path:key}", response=MemoryKeyOut, operation_id="memory_key_get", summary="One live key; 404 not_found"
)
async def memory_key_get(request: HttpRequest, scope: str, scope_id: str, key: str) -> JsonResponse:
    return JsonResponse(await db_call(keyops.key_get)(request_principal(request), scope, scope_id, key))


@router.put(
    _PREFIX + "/{path:key}",
    response=MemoryPutOut,
    operation_id="memory_key_put",
    summary="Write a key: {value, embed?, ttl_seconds?}; 413 memory_value_too_large / memory_quota_exceeded",
    openapi_extra=openapi_body(keyops.MemoryPutIn),
)
async def memory_key_put(request: HttpRequest, scope: str, scope_id: str, key: str) -> JsonResponse:
    body = parse_body(request, keyops.MemoryPutIn, max_bytes=ADMIN_BODY_BYTES)
    embed_q = request.GET.get("embed", "").lower() in ("1", "true")
    return JsonResponse(await db_call(keyops.key_put)(request_principal(request), scope, scope_id, key, body, embed_q))


@router.delete(
    _PREFIX + "/{path:key}", response={204: None}, operation_id="memory_key_delete", summary="Delete a key (always 204)"
)
async def memory_key_delete(request: HttpRequest, scope: str, scope_id: str, key: str) -> HttpResponse:
    await db_call(keyops.key_delete)(request_principal(request), scope, scope_id, key)
    return HttpResponse(status=204)


@router.post(
    "/_memory/search",
    response=MemorySearchOut,
    operation_id="memory_search",
    summary="Vector search {query, scope, scope_id, top_k, rank, dedup}",
    openapi_extra=openapi_body(keyops.MemorySearchIn, enums={"scope": MemoryScope.values}),
)
async def memory_search(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, keyops.MemorySearchIn, max_bytes=ADMIN_BODY_BYTES)
    return JsonResponse(await db_call(keyops.search)(request_principal(request), body))
