"""The operator plane's memory verbs (SPEC 2.8): one (scope, scope_id) in the caller's tenant.
REST (apps/memory/api.py) and gRPC's Memory RPC (apps/grpcapi) call these; the rules live here
and in the selectors and services they call.

The tenant is always the credential's: another tenant's key is simply absent (404 on get,
nothing listed). Tenant and global scopes ignore scope_id. Global rows belong to the
deployment's tenant (""): every tenant reads them, only a principal of that tenant writes them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from apps.core.errors import Invalid, NotFound
from apps.core.numbers import parse_count
from apps.core.types import Principal
from apps.memory import presenters, selectors, services

MAX_TTL_SECONDS = 10 * 365 * 86400


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


def key_put(
    principal: Principal, scope: str, scope_id: str, key: str, body: MemoryPutIn, embed_q: bool = False
) -> dict[str, Any]:
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


def key_get(principal: Principal, scope: str, scope_id: str, key: str) -> dict[str, Any]:
    slot = selectors.slot_for(principal, scope, scope_id, write=False)
    row = selectors.memory_get(slot=slot, key=key)
    if row is None:
        raise NotFound(f"no key {key!r} in {scope} memory", code="not_found")
    return {"scope": scope, "scope_id": slot.scope_id, "entry": presenters.entry_rest(row)}


def key_delete(principal: Principal, scope: str, scope_id: str, key: str) -> None:
    services.memory_delete(slot=selectors.slot_for(principal, scope, scope_id, write=True), key=key)


def keys_list(principal: Principal, scope: str, scope_id: str, prefix: str, limit_raw: str) -> dict[str, Any]:
    slot = selectors.slot_for(principal, scope, scope_id, write=False)
    limit = parse_count(limit_raw)
    if limit is None or not 1 <= limit <= 1000:
        raise Invalid("limit must be an integer between 1 and 1000", code="invalid_limit")
    rows, truncated = selectors.memory_list(slot=slot, prefix=prefix, limit=limit)
    entries = [presenters.entry_rest(r) for r in rows]
    return {"scope": scope, "scope_id": slot.scope_id, "entries": entries, "truncated": truncated}


def search(principal: Principal, body: MemorySearchIn) -> dict[str, Any]:
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
