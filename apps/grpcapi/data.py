"""The Memory RPC: loomcycle's Memory op-dispatch (`input_json` {op, scope, key, ...}) over the
operator plane's memory verbs, apps.memory.keyops, which /v1/_memory/... calls too, with that
route's scope: a read op as GET (tenant operators; a tenant's members may read), a write as PUT.

Ops: get, set (value, ttl_seconds or loomcycle's ttl, embed, embed_text), delete, list (prefix,
limit), search (query, top_k, rank, dedup). `scope_id` defaults, as loomcycle resolves it, to
the caller's own subject for `user`; `agent` needs one. loomcycle's other ops (incr, merge,
add, recall, ...) are refused as the tool refuses an op it lacks (`is_error`)."""

from __future__ import annotations

import json
from typing import Any

from apps.core.errors import Invalid
from apps.core.http import db_call, loads_checked
from apps.core.types import Principal
from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.rpc import Route, parsed, unary
from apps.memory import keyops

READS = frozenset({"get", "list", "search"})
OPS = ("get", "set", "delete", "list", "search")
_MEMORY_PATH = "/v1/_memory/scopes/x/x/keys"


def _op(request: pb.SubstrateRequest) -> str:
    try:
        data = json.loads(request.input_json or b"{}")
    except ValueError:
        return ""
    return str(data.get("op") or "") if isinstance(data, dict) else ""


def memory_route(request: pb.SubstrateRequest) -> Route:
    return ("GET" if _op(request) in READS else "PUT", _MEMORY_PATH)


def _scope_id(principal: Principal, data: dict[str, Any]) -> str:
    given = data.get("scope_id")
    if isinstance(given, str) and given:
        return given
    return principal.subject if data.get("scope") == "user" else ""


def _set(principal: Principal, scope: str, scope_id: str, data: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {k: data[k] for k in ("value", "embed", "embed_text") if k in data}
    ttl = data.get("ttl_seconds", data.get("ttl"))
    if ttl is not None:
        fields["ttl_seconds"] = ttl
    return keyops.key_put(principal, scope, scope_id, str(data.get("key") or ""), parsed(keyops.MemoryPutIn, fields))


def _dispatch(principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    op, scope = data.get("op"), str(data.get("scope") or "")
    scope_id, key = _scope_id(principal, data), str(data.get("key") or "")
    if op == "get":
        return keyops.key_get(principal, scope, scope_id, key)
    if op == "set":
        return _set(principal, scope, scope_id, data)
    if op == "delete":
        keyops.key_delete(principal, scope, scope_id, key)
        return {"scope": scope, "key": key, "deleted": True}
    if op == "list":
        return keyops.keys_list(principal, scope, scope_id, str(data.get("prefix") or ""), str(data.get("limit", 200)))
    search: dict[str, Any] = {k: data[k] for k in ("query", "top_k", "rank", "dedup") if k in data}
    return keyops.search(principal, parsed(keyops.MemorySearchIn, {**search, "scope": scope, "scope_id": scope_id}))


class DataRpcs:
    @unary(memory_route)
    async def Memory(self, request: pb.SubstrateRequest, principal: Principal) -> pb.SubstrateResponse:
        data = loads_checked(request.input_json or b"")
        if not isinstance(data, dict):
            raise Invalid("input_json must be a JSON object (the Memory tool's input)", code="invalid_body")
        if data.get("op") not in OPS:
            text = f"Memory: op must be one of {', '.join(OPS)} here (got {data.get('op')!r})"
            info = pb.ErrorInfo(category="unsupported_op", description=text)
            return pb.SubstrateResponse(output_json=text.encode(), is_error=True, error_info=info)
        out = await db_call(_dispatch)(principal, data)
        return pb.SubstrateResponse(output_json=json.dumps(out, separators=(",", ":")).encode())
