"""Memory reads (SPEC 6.2, 9.5): get, list, and vector search.

Every read names its `Slot` (tenant, scope, scope_id) and sees live rows
only: a row whose `expires_at` has passed is absent even before beat deletes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.core.errors import Forbidden, Invalid
from apps.core.types import Principal
from apps.memory.models import MemoryEntry, MemoryScope
from apps.memory.services import Slot, embed_one

SEARCH_POOL_FACTOR = 4  # cosine candidates fetched per requested result, before re-ranking and dedup
SEARCH_POOL_MIN = 50


MAX_SCOPE_ID_CHARS = 256  # the column width (MemoryEntry.scope_id)


def slot_for(principal: Principal, scope: str, scope_id: str, *, write: bool) -> Slot:
    """The slot a REST caller reaches: its own tenant's (global: the deployment's,
    written only by the deployment's own tenant); user/agent scopes need a scope_id."""
    if scope not in MemoryScope.values:
        raise Invalid(f"scope must be one of {', '.join(MemoryScope.values)}", code="invalid_scope")
    if scope in (MemoryScope.TENANT, MemoryScope.GLOBAL):
        if scope == MemoryScope.GLOBAL and write and principal.tenant_id:
            raise Forbidden("global memory is written only by the deployment's own tenant", code="forbidden")
        return Slot("" if scope == MemoryScope.GLOBAL else principal.tenant_id, scope, "")
    if not scope_id or scope_id == "-":
        raise Invalid(f"scope {scope} needs a scope_id", code="missing_scope_id")
    if len(scope_id) > MAX_SCOPE_ID_CHARS:
        raise Invalid(f"scope_id must be at most {MAX_SCOPE_ID_CHARS} characters", code="invalid_scope_id")
    return Slot(principal.tenant_id, scope, scope_id)


def _live(slot: Slot) -> QuerySet[MemoryEntry]:
    alive = Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
    return MemoryEntry.objects.filter(slot.rows()).filter(alive)


def memory_get(*, slot: Slot, key: str) -> MemoryEntry | None:
    return _live(slot).filter(key=key).first()


def memory_list(*, slot: Slot, prefix: str = "", limit: int = 100) -> tuple[list[MemoryEntry], bool]:
    """Live entries in key order, at most `limit`; the flag says more matched."""
    rows = _live(slot)
    if prefix:
        rows = rows.filter(key__startswith=prefix)
    found = list(rows.order_by("key").defer("embedding")[: limit + 1])
    return found[:limit], len(found) > limit


@dataclass(frozen=True)
class Rank:
    """Hybrid ranking (SPEC 9.5): score = (w_s * cosine + w_r * 0.5^(age / half_life)) / (w_s + w_r).
    The default is pure cosine."""

    semantic_weight: float = 1.0
    recency_weight: float = 0.0
    recency_half_life_hours: float = 168.0


@dataclass(frozen=True)
class Dedup:
    """Search-time dedup: a candidate whose cosine to a better-ranked kept one is
    >= threshold is dropped (`drop`) or folded into it (`merge`: listed under
    `merged_keys`); `keep` (or enabled=false) keeps every candidate."""

    enabled: bool = False
    threshold: float = 0.92
    mode: str = "drop"


@dataclass
class Hit:
    entry: MemoryEntry
    similarity: float
    score: float
    vector: list[float]
    merged_keys: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SearchResult:
    hits: list[Hit]
    truncated: bool
    dimensions: int
    provider: str
    model: str


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def _pool(slot: Slot, vector: list[float], provider: str, model: str, size: int) -> list[tuple[int, float]]:
    # `+ 0` keeps the planner off the HNSW index: an approximate scan filtered
    # afterwards by scope can return fewer rows than asked; the scope's rows are
    # found through the unique (tenant, scope, scope_id, key) index and ranked exactly.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, (embedding <=> %s::vector) + 0 AS distance FROM {MemoryEntry._meta.db_table}"
            " WHERE tenant_id = %s AND scope = %s AND scope_id = %s AND embedding IS NOT NULL"
            " AND embedding_provider = %s AND embedding_model = %s"
            " AND (expires_at IS NULL OR expires_at > now())"
            " ORDER BY distance, key LIMIT %s",
            [str(vector), slot.tenant_id, slot.scope, slot.scope_id, provider, model, size],
        )
        return [(int(row_id), float(distance)) for row_id, distance in cursor.fetchall()]


def _score(similarity: float, updated_at: datetime, rank: Rank, now: datetime) -> float:
    weights = rank.semantic_weight + rank.recency_weight
    if weights <= 0:
        return similarity
    age_hours = max(0.0, (now - updated_at).total_seconds() / 3600.0)
    recency = 0.5 ** (age_hours / rank.recency_half_life_hours) if rank.recency_half_life_hours > 0 else 0.0
    return (rank.semantic_weight * similarity + rank.recency_weight * recency) / weights


def _dedup(hits: list[Hit], dedup: Dedup) -> list[Hit]:
    if not dedup.enabled or dedup.mode == "keep":
        return hits
    kept: list[Hit] = []
    for hit in hits:
        twin = next((k for k in kept if _cosine(k.vector, hit.vector) >= dedup.threshold), None)
        if twin is None:
            kept.append(hit)
        elif dedup.mode == "merge":
            twin.merged_keys.append(hit.entry.key)
    return kept


def memory_search(
    *,
    slot: Slot,
    query: str,
    top_k: int = 10,
    rank: Rank | None = None,
    dedup: Dedup | None = None,
    on_behalf_of: Principal | None = None,
) -> SearchResult:
    """The `top_k` best live entries of the slot for `query`: the nearest by cosine
    (over-fetched), re-ranked by the hybrid score, deduplicated. Only vectors made
    by the configured embedder take part. Raises EmbedderNotConfigured / EmbedFailed,
    or Forbidden when `on_behalf_of` may not spend the embedder's key (services.embed_one)."""
    rank, dedup = rank or Rank(), dedup or Dedup()
    vector, embedder = embed_one(query, on_behalf_of=on_behalf_of)
    pool = _pool(slot, vector, embedder.id, embedder.model, max(top_k * SEARCH_POOL_FACTOR, SEARCH_POOL_MIN))
    rows = {e.id: e for e in MemoryEntry.objects.filter(id__in=[row_id for row_id, _ in pool])}
    now = timezone.now()
    hits = []
    for row_id, distance in pool:
        entry = rows.get(row_id)
        if entry is None:  # deleted between the two reads
            continue
        similarity = min(1.0, max(0.0, 1.0 - distance))
        stored: Any = entry.embedding
        hits.append(Hit(entry, similarity, _score(similarity, entry.updated_at, rank, now), [float(x) for x in stored]))
    hits.sort(key=lambda h: (-h.score, h.entry.key))
    kept = _dedup(hits, dedup)
    return SearchResult(kept[:top_k], len(kept) > top_k, len(vector), embedder.id, embedder.model)


MAX_KEY_CHARS = 512


class BadSearchOptions(ValueError):
    """`rank` / `dedup` are not what a search takes; the message says what to fix."""


def search_options(data: dict[str, Any]) -> tuple[Rank, Dedup]:
    """`rank` and `dedup` objects (tool input and the REST body share them)."""
    rank_in, dedup_in = data.get("rank") or {}, data.get("dedup")
    if not isinstance(rank_in, dict) or not (dedup_in is None or isinstance(dedup_in, dict)):
        raise BadSearchOptions("rank and dedup must be objects")
    try:
        rank = Rank(
            semantic_weight=float(rank_in.get("semantic_weight", 1.0)),
            recency_weight=float(rank_in.get("recency_weight", 0.0)),
            recency_half_life_hours=float(rank_in.get("recency_half_life_hours", 168.0)),
        )
        dedup = Dedup()
        if dedup_in is not None:
            dedup = Dedup(
                enabled=dedup_in.get("enabled", True) is not False,
                threshold=float(dedup_in.get("threshold", 0.92)),
                mode=str(dedup_in.get("mode", "drop")),
            )
    except (TypeError, ValueError) as exc:
        raise BadSearchOptions(f"rank/dedup fields must be numbers: {exc}") from exc
    if rank.semantic_weight < 0 or rank.recency_weight < 0:
        raise BadSearchOptions("rank weights must not be negative")
    if dedup.mode not in ("drop", "merge", "keep"):
        raise BadSearchOptions(f"dedup.mode must be drop, merge or keep (got {dedup.mode!r})")
    return rank, dedup
