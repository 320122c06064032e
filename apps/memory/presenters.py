"""Memory wire shapes: an entry as REST and the Memory tool show it, and a
search result. Pure functions of what the selectors return."""

from __future__ import annotations

from typing import Any

from apps.core.timefmt import ts
from apps.memory import selectors
from apps.memory.models import MemoryEntry


def entry_tool(row: MemoryEntry) -> dict[str, Any]:
    """An entry as the Memory tool lists it."""
    return {"key": row.key, "value": row.value, "expires_at": ts(row.expires_at)}


def entry_rest(row: MemoryEntry) -> dict[str, Any]:
    return {
        "key": row.key,
        "value": row.value,
        "expires_at": ts(row.expires_at),
        "created_at": ts(row.created_at),
        "updated_at": ts(row.updated_at),
        "embedded": row.embedding is not None,
    }


def search_out(result: selectors.SearchResult) -> dict[str, Any]:
    entries = []
    for hit in result.hits:
        item = {
            **entry_tool(hit.entry),
            "score": round(hit.score, 6),
            "similarity": round(hit.similarity, 6),
            "embedded_with": {"provider": hit.entry.embedding_provider, "model": hit.entry.embedding_model},
            "kind": "fact",
        }
        if hit.merged_keys:
            item["merged_keys"] = hit.merged_keys
        entries.append(item)
    return {"entries": entries, "query_embedding_dim": result.dimensions, "truncated": result.truncated}
