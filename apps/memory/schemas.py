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


class EmbeddedWithOut(BaseModel):
    provider: str
    model: str


class MemoryHitOut(BaseModel):
    key: str
    value: Any
    expires_at: str | None
    score: float  # the hybrid score the hits are ordered by
    similarity: float  # cosine, 0..1
    embedded_with: EmbeddedWithOut
    kind: str  # "fact"
    merged_keys: list[str] | None = None  # present when dedup folded near-duplicates into this hit


class MemorySearchOut(BaseModel):
    scope: str
    scope_id: str
    entries: list[MemoryHitOut]
    query_embedding_dim: int
    truncated: bool
