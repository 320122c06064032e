"""Response schemas of the memory routes (apps/memory/api.py) for /v1/openapi.json. The routes
answer with the dicts apps.memory.keyops and presenters build; these models document them
(tests/core/test_api_fuzz.py checks answers against the schema)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class MemoryScopesOut(BaseModel):
    scopes: list[str]


class MemoryEntryOut(BaseModel):
    key: str
    value: Any
    expires_at: str | None
    created_at: str | None
    updated_at: str | None
    embedded: bool


class MemoryKeyOut(BaseModel):
    scope: str
    scope_id: str
    entry: MemoryEntryOut


class MemoryKeysOut(BaseModel):
    scope: str
    scope_id: str
    entries: list[MemoryEntryOut]
    truncated: bool


class MemoryPutOut(BaseModel):
    scope: str
    scope_id: str
    key: str
    embedded: bool
    embed_warning: str | None = None  # present when embedding failed and the value was stored unembedded
