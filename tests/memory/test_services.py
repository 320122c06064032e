"""Memory services and selectors against the real Postgres + pgvector:
values, TTL, the sweeper, quotas, atomic incr and vector search."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from apps.gateway.embedders.hashing import hash_embed
from apps.memory import selectors, services
from apps.memory.models import MemoryEntry
from apps.memory.selectors import Dedup, Rank
from apps.memory.services import Slot
from apps.memory.tasks import memory_expired_sweep_task

pytestmark = pytest.mark.django_db

ACME = Slot("acme", "agent", "bot")
BETA = Slot("beta", "agent", "bot")


def test_set_get_list_delete_roundtrip() -> None:
    services.memory_set(slot=ACME, key="notes/a", value={"x": [1, 2]})
    services.memory_set(slot=ACME, key="notes/b", value="two")
    services.memory_set(slot=ACME, key="other", value=3)
    assert selectors.memory_get(slot=ACME, key="notes/a").value == {"x": [1, 2]}  # type: ignore[union-attr]
    rows, truncated = selectors.memory_list(slot=ACME, prefix="notes/", limit=1)
    assert [r.key for r in rows] == ["notes/a"] and truncated
    rows, truncated = selectors.memory_list(slot=ACME, prefix="notes/", limit=10)
    assert [r.key for r in rows] == ["notes/a", "notes/b"] and not truncated
    assert services.memory_delete(slot=ACME, key="notes/a") is True
    assert services.memory_delete(slot=ACME, key="notes/a") is False  # idempotent
    assert selectors.memory_get(slot=ACME, key="notes/a") is None


def test_another_tenants_rows_are_invisible() -> None:
    services.memory_set(slot=ACME, key="k", value="acme's")
    assert selectors.memory_get(slot=BETA, key="k") is None
    assert selectors.memory_list(slot=BETA)[0] == []
    assert services.memory_delete(slot=BETA, key="k") is False
    assert selectors.memory_get(slot=ACME, key="k").value == "acme's"  # type: ignore[union-attr]


def test_expired_keys_are_invisible_and_the_sweeper_deletes_them() -> None:
    services.memory_set(slot=ACME, key="short", value=1, ttl_seconds=60)
    services.memory_set(slot=ACME, key="kept", value=2, ttl_seconds=3600)
    services.memory_set(slot=ACME, key="forever", value=3)
    assert selectors.memory_get(slot=ACME, key="short") is not None
    MemoryEntry.objects.filter(key="short").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert selectors.memory_get(slot=ACME, key="short") is None
    assert [r.key for r in selectors.memory_list(slot=ACME)[0]] == ["forever", "kept"]
    assert services.memory_delete(slot=ACME, key="short") is False  # an expired row is not "deleted"
    services.memory_set(slot=ACME, key="short2", value=1, ttl_seconds=60)
    MemoryEntry.objects.filter(key="short2").update(expires_at=timezone.now() - timedelta(seconds=1))
    assert memory_expired_sweep_task() == 1
    assert sorted(MemoryEntry.objects.values_list("key", flat=True)) == ["forever", "kept"]
    assert memory_expired_sweep_task() == 0


def test_sweeper_works_in_batches() -> None:
    past = timezone.now() - timedelta(seconds=5)
    MemoryEntry.objects.bulk_create(
        [MemoryEntry(tenant_id="t", scope="tenant", key=f"k{i}", value=i, expires_at=past) for i in range(25)]
    )
    assert services.memory_expired_sweep(batch=10) == 25
    assert not MemoryEntry.objects.exists()


def test_incr_starts_at_zero_counts_and_refuses_non_numbers() -> None:
    assert services.memory_incr(slot=ACME, key="n")[0] == 1
    assert services.memory_incr(slot=ACME, key="n", delta=5)[0] == 6
    assert services.memory_incr(slot=ACME, key="n", delta=-2)[0] == 4
    services.memory_set(slot=ACME, key="f", value=1.5)
    assert services.memory_incr(slot=ACME, key="f")[0] == 2.5
    services.memory_set(slot=ACME, key="s", value="text")
    with pytest.raises(services.NotANumber, match="not a JSON number"):
        services.memory_incr(slot=ACME, key="s")
    assert selectors.memory_get(slot=ACME, key="s").value == "text"  # type: ignore[union-attr]


def test_incr_on_an_expired_key_restarts_and_ttl_resets_expiry() -> None:
    services.memory_set(slot=ACME, key="c", value="stale text", ttl_seconds=60)
    MemoryEntry.objects.filter(key="c").update(expires_at=timezone.now() - timedelta(seconds=1))
    value, expires_at = services.memory_incr(slot=ACME, key="c", delta=3)
    assert (value, expires_at) == (3, None)  # expired non-number: starts again at 0, no expiry carried
    value, expires_at = services.memory_incr(slot=ACME, key="c", ttl_seconds=100)
    assert value == 4 and expires_at is not None
    assert timedelta(seconds=90) < expires_at - timezone.now() <= timedelta(seconds=100)


def test_value_cap_and_scope_quota(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, memory_max_value_bytes=100)
    with pytest.raises(services.MemoryValueTooLarge):
        services.memory_set(slot=ACME, key="big", value="x" * 200)
    services.memory_set(slot=ACME, key="a", value="x" * 50, quota_bytes=120)
    services.memory_set(slot=ACME, key="a", value="y" * 60, quota_bytes=120)  # replacing a key frees its old bytes
    with pytest.raises(services.MemoryQuotaExceeded) as info:
        services.memory_set(slot=ACME, key="b", value="z" * 60, quota_bytes=120)
    assert info.value.status == 413 and info.value.details["quota"] == 120
    assert selectors.memory_get(slot=ACME, key="b") is None
    services.memory_set(slot=Slot("acme", "agent", "other"), key="b", value="z" * 60, quota_bytes=120)  # per slot


def test_more_than_1000_keys_is_refused() -> None:
    MemoryEntry.objects.bulk_create(
        [MemoryEntry(tenant_id="acme", scope="agent", scope_id="bot", key=f"k{i}", value=0) for i in range(1000)]
    )
    with pytest.raises(services.MemoryQuotaExceeded, match="1000"):
        services.memory_set(slot=ACME, key="one-more", value=1)
    services.memory_set(slot=ACME, key="k5", value=1)  # an existing key may still change


CORPUS = {
    "cat": "the cat sat on the mat",
    "cats": "dogs chase cats around the park",
    "market": "stock market prices fell sharply today",
    "physics": "quantum physics lecture notes",
    "recipe": "a recipe for tomato soup with basil",
}


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (
        math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    )


def _seed_corpus(slot: Slot) -> None:
    for key, text in CORPUS.items():
        assert services.memory_set(slot=slot, key=key, value={"text": text}, embed=True, embed_text=text).embedded


def test_search_returns_the_nearest_entries_in_order() -> None:
    _seed_corpus(ACME)
    services.memory_set(slot=ACME, key="unembedded", value="cat mat cat mat")  # no vector: never a hit
    services.memory_set(slot=BETA, key="beta-cat", value="the cat sat on the mat", embed=True)  # another tenant
    query = "a cat on a mat"
    found = selectors.memory_search(slot=ACME, query=query, top_k=3)
    expected = sorted(CORPUS, key=lambda k: -_cos(hash_embed(query, 384), hash_embed(CORPUS[k], 384)))
    assert [h.entry.key for h in found.hits] == expected[:3]
    assert found.hits[0].entry.key == "cat" and found.truncated and found.dimensions == 384
    for hit in found.hits:
        want = max(0.0, _cos(hash_embed(query, 384), hash_embed(CORPUS[hit.entry.key], 384)))
        assert hit.score == pytest.approx(want, abs=1e-5)
        assert (hit.entry.embedding_provider, hit.entry.embedding_model) == ("hashing", "hashing-v1")
    everything = selectors.memory_search(slot=ACME, query=query, top_k=50)
    assert [h.entry.key for h in everything.hits] == expected and not everything.truncated


def test_search_skips_expired_rows_and_ranks_by_recency_when_asked() -> None:
    _seed_corpus(ACME)
    MemoryEntry.objects.filter(key="physics").update(expires_at=timezone.now() - timedelta(seconds=1))
    keys = [h.entry.key for h in selectors.memory_search(slot=ACME, query="quantum physics", top_k=5).hits]
    assert "physics" not in keys
    services.memory_set(slot=ACME, key="cat-new", value="the cat sat on the mat", embed=True)
    MemoryEntry.objects.filter(key="cat").update(updated_at=timezone.now() - timedelta(days=30))
    pure = selectors.memory_search(slot=ACME, query="the cat sat on the mat", top_k=2)
    assert [h.entry.key for h in pure.hits] == ["cat", "cat-new"]  # equal cosine: key order
    recent = selectors.memory_search(
        slot=ACME, query="the cat sat on the mat", top_k=2, rank=Rank(recency_weight=0.3, recency_half_life_hours=24)
    )
    assert [h.entry.key for h in recent.hits] == ["cat-new", "cat"]
    assert recent.hits[0].score > recent.hits[1].score


def test_search_dedup_drops_or_merges_near_duplicates() -> None:
    _seed_corpus(ACME)
    services.memory_set(slot=ACME, key="cat-again", value="the cat sat on the mat", embed=True)
    query = "cat mat"
    plain = [h.entry.key for h in selectors.memory_search(slot=ACME, query=query, top_k=4).hits]
    assert plain[:2] == ["cat", "cat-again"]
    dropped = selectors.memory_search(slot=ACME, query=query, top_k=3, dedup=Dedup(enabled=True))
    assert [h.entry.key for h in dropped.hits] == [k for k in plain if k != "cat-again"]  # the next one fills in
    merged = selectors.memory_search(slot=ACME, query=query, top_k=3, dedup=Dedup(enabled=True, mode="merge"))
    assert merged.hits[0].entry.key == "cat" and merged.hits[0].merged_keys == ["cat-again"]


def test_without_an_embedder_set_still_writes_and_search_refuses(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, embedder="none")
    result = services.memory_set(slot=ACME, key="k", value="text", embed=True)
    assert not result.embedded and "embedder_not_configured" in (result.embed_warning or "")
    assert selectors.memory_get(slot=ACME, key="k") is not None
    with pytest.raises(services.EmbedderNotConfigured):
        selectors.memory_search(slot=ACME, query="text")


_INCR_SCRIPT = """
import django, sys
django.setup()
from apps.memory import services
slot = services.Slot("acme", "tenant", "")
for _ in range(int(sys.argv[1])):
    services.memory_incr(slot=slot, key="hits")
"""


@pytest.mark.django_db(transaction=True)
def test_50_parallel_incr_from_5_processes_end_at_50(stack_env: dict[str, str]) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", _INCR_SCRIPT, "10"], env=stack_env, stderr=subprocess.PIPE)
        for _ in range(5)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    row: Any = selectors.memory_get(slot=Slot("acme", "tenant", ""), key="hits")
    assert row.value == 50
