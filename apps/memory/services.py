"""Memory writes (SPEC 6.2, 9.5): set, delete, atomic incr, the TTL sweep.

Invariants:
- A namespace is a `Slot` (tenant, scope, scope_id); every statement names
  all three, so one tenant never touches another's rows.
- An expired row is invisible at once (selectors filter on `expires_at`);
  `set` and `incr` overwrite it as if it were absent; beat deletes it later.
- Writes to one slot take a transaction-scoped advisory lock on the slot, so
  the quota check and the write it guards cannot interleave with another
  writer's. No lock is held across an embedder call: vectors are computed first.
- An embedding made for a principal (REST, the MCP server's memory tools:
  `on_behalf_of`) spends the operator's embedder key only if that principal may
  (apps.gateway.operator_key, as /v1/embeddings): else 403 `operator_key_restricted`,
  before anything is written. A run's own Memory tool and the operator's hooks
  embed for no principal and are not gated (runs are not: runs:create is theirs).
- `incr` is one `INSERT ... ON CONFLICT DO UPDATE`: the increment happens in
  Postgres, so concurrent increments from any number of processes never lose
  an update.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from apps.core.errors import Invalid, PayloadTooLarge
from apps.core.types import Principal
from apps.gateway.embedders import Embedder, EmbedError, get_embedder
from apps.gateway.embeddings import EmbedderNotConfigured, EmbedFailed  # one definition of each code
from apps.gateway.operator_key import operator_key_check
from apps.memory.models import EMBEDDING_DIMENSIONS, MemoryEntry

MAX_KEYS_PER_SCOPE = 1000  # SPEC 6.2: beyond this many keys the quota check refuses
SWEEP_BATCH = 1000


class MemoryValueTooLarge(PayloadTooLarge):
    code = "memory_value_too_large"


class MemoryQuotaExceeded(PayloadTooLarge):
    code = "memory_quota_exceeded"


class NotANumber(Invalid):
    code = "not_a_number"


@dataclass(frozen=True)
class Slot:
    """One memory namespace. `scope_id` is "" for tenant and global scopes."""

    tenant_id: str
    scope: str
    scope_id: str

    def rows(self) -> Q:
        return Q(tenant_id=self.tenant_id, scope=self.scope, scope_id=self.scope_id)


@dataclass(frozen=True)
class SetResult:
    embedded: bool
    embed_warning: str | None
    expires_at: datetime | None


def value_bytes(value: Any) -> int:
    """A value's size as compact UTF-8 JSON (what the value cap and the quota count)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def embed_text_of(value: Any) -> str:
    """The text embedded for a value: a string as is, anything else as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def configured_embedder() -> Embedder:
    embedder = get_embedder()
    if embedder is None:
        raise EmbedderNotConfigured("no embedder is configured (memory.embedder or LOOMCYCLE_EMBEDDER)")
    if embedder.dimensions != EMBEDDING_DIMENSIONS:
        raise EmbedFailed(
            f"embedder {embedder.id}/{embedder.model} makes {embedder.dimensions}-dimension vectors; "
            f"the memory column holds {EMBEDDING_DIMENSIONS}",
            code="dimension_mismatch",
        )
    return embedder


def embed_one(text: str, *, on_behalf_of: Principal | None = None) -> tuple[list[float], Embedder]:
    """The configured embedder's vector for `text`; EmbedderNotConfigured or EmbedFailed,
    or Forbidden (403 operator_key_restricted) when `on_behalf_of` may not spend its key."""
    embedder = configured_embedder()
    if on_behalf_of is not None:  # before the call: a refused principal spends nothing
        operator_key_check(on_behalf_of, embedder, embedder.id)
    try:
        return embedder.embed([text])[0], embedder
    except EmbedError as exc:
        raise EmbedFailed(f"embedding failed: {exc.message}") from exc


def _lock_slot(slot: Slot) -> None:
    # Serialises writers of one slot for this transaction: quota check + write are one step.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            ["memory:" + json.dumps([slot.tenant_id, slot.scope, slot.scope_id])],
        )


def _used_bytes(slot: Slot, key: str) -> tuple[int, int]:
    """(keys, bytes) of the slot's live rows other than `key`; bytes = sum of key + compact JSON value."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), coalesce(sum(octet_length(key) + octet_length(value::text)), 0)"
            f" FROM {MemoryEntry._meta.db_table}"
            " WHERE tenant_id = %s AND scope = %s AND scope_id = %s AND key <> %s"
            " AND (expires_at IS NULL OR expires_at > now())",
            [slot.tenant_id, slot.scope, slot.scope_id, key],
        )
        keys, used = cursor.fetchone()
    return int(keys), int(used)


def _check_quota(slot: Slot, key: str, value_size: int, quota_bytes: int) -> None:
    """MemoryQuotaExceeded when writing `key` would pass the key count or byte quota. Caller holds the slot lock."""
    keys, used = _used_bytes(slot, key)
    if keys >= MAX_KEYS_PER_SCOPE:
        raise MemoryQuotaExceeded(
            f"{slot.scope} memory already holds {keys} other keys (at most {MAX_KEYS_PER_SCOPE})",
            details={"max_keys": MAX_KEYS_PER_SCOPE},
        )
    requested = len(key.encode()) + value_size
    if used + requested > quota_bytes:
        raise MemoryQuotaExceeded(
            f"{slot.scope} memory quota exceeded: {used} bytes in other keys + {requested} > {quota_bytes}",
            details={"used": used, "requested": requested, "quota": quota_bytes},
        )


def _expiry(ttl_seconds: int | None) -> datetime | None:
    return timezone.now() + timedelta(seconds=ttl_seconds) if ttl_seconds else None


def _check_value(value: Any) -> int:
    size, limit = value_bytes(value), settings.LOOMCYCLE.memory_max_value_bytes
    if size > limit:
        raise MemoryValueTooLarge(
            f"value is {size} bytes, over the {limit}-byte limit", details={"size": size, "limit": limit}
        )
    return size


def memory_set(
    *,
    slot: Slot,
    key: str,
    value: Any,
    ttl_seconds: int | None = None,
    embed: bool = False,
    embed_text: str | None = None,
    quota_bytes: int | None = None,
    on_behalf_of: Principal | None = None,
) -> SetResult:
    """Write `value` under `key` (replacing it, live or expired). With `embed`, the
    value's text is embedded first; an embedder failure still writes the value,
    unembedded, and says why in `embed_warning`. A principal (`on_behalf_of`) that may
    not spend the embedder's key is refused (403) and nothing is written."""
    size = _check_value(value)
    vector: list[float] | None = None
    embedder: Embedder | None = None
    warning: str | None = None
    if embed:
        try:
            text = embed_text if embed_text is not None else embed_text_of(value)
            vector, embedder = embed_one(text, on_behalf_of=on_behalf_of)
        except (EmbedderNotConfigured, EmbedFailed) as exc:
            warning = f"{exc.code}: {exc.message}"
    expires_at = _expiry(ttl_seconds)
    with transaction.atomic():
        _lock_slot(slot)
        _check_quota(slot, key, size, settings.LOOMCYCLE.memory_max_scope_bytes if quota_bytes is None else quota_bytes)
        with connection.cursor() as cursor:
            cursor.execute(
                _SET_SQL,
                {
                    "tenant": slot.tenant_id,
                    "scope": slot.scope,
                    "scope_id": slot.scope_id,
                    "key": key,
                    "value": json.dumps(value),
                    "expires_at": expires_at,
                    "embedding": None if vector is None else "[" + ",".join(map(repr, vector)) + "]",
                    "provider": embedder.id if embedder else "",
                    "model": embedder.model if embedder else "",
                },
            )
    return SetResult(embedded=vector is not None, embed_warning=warning, expires_at=expires_at)


_TABLE = MemoryEntry._meta.db_table
_LIVE = "(expires_at IS NULL OR expires_at > now())"

# One upsert: the row is replaced whole (value, expiry, embedding), live or expired.
_SET_SQL = f"""
INSERT INTO {_TABLE} AS m (tenant_id, scope, scope_id, key, value, expires_at, embedding,
    embedding_provider, embedding_model, created_at, updated_at)
VALUES (%(tenant)s, %(scope)s, %(scope_id)s, %(key)s, %(value)s::jsonb, %(expires_at)s, %(embedding)s::vector,
    %(provider)s, %(model)s, now(), now())
ON CONFLICT ON CONSTRAINT memoryentry_tenant_scope_key DO UPDATE SET
    value = EXCLUDED.value, expires_at = EXCLUDED.expires_at, embedding = EXCLUDED.embedding,
    embedding_provider = EXCLUDED.embedding_provider, embedding_model = EXCLUDED.embedding_model, updated_at = now()
"""


def memory_delete(*, slot: Slot, key: str) -> bool:
    """Delete `key`; True when a live row went (an expired one goes too, quietly). Idempotent."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {_TABLE} WHERE tenant_id = %s AND scope = %s AND scope_id = %s AND key = %s"
            f" RETURNING {_LIVE}",
            [slot.tenant_id, slot.scope, slot.scope_id, key],
        )
        row = cursor.fetchone()
    return bool(row and row[0])


# One statement: a missing or expired key starts from 0; a live number is
# incremented in place; a live non-number matches no row in DO UPDATE's WHERE,
# so nothing is written and RETURNING is empty. `ttl` (when given) resets the
# expiry; without it a live key keeps its own and a restarted one never expires.
_INCR_SQL = f"""
INSERT INTO {_TABLE} AS m
    (tenant_id, scope, scope_id, key, value, expires_at, embedding_provider, embedding_model, created_at, updated_at)
VALUES (%(tenant)s, %(scope)s, %(scope_id)s, %(key)s, to_jsonb(%(delta)s::numeric), %(expires_at)s,
        '', '', now(), now())
ON CONFLICT ON CONSTRAINT memoryentry_tenant_scope_key DO UPDATE SET
    value = CASE WHEN m.expires_at IS NOT NULL AND m.expires_at <= now() THEN to_jsonb(%(delta)s::numeric)
                 ELSE to_jsonb((m.value)::numeric + %(delta)s::numeric) END,
    expires_at = CASE WHEN %(has_ttl)s THEN EXCLUDED.expires_at
                      WHEN m.expires_at IS NOT NULL AND m.expires_at <= now() THEN NULL
                      ELSE m.expires_at END,
    embedding = CASE WHEN m.expires_at IS NOT NULL AND m.expires_at <= now() THEN NULL ELSE m.embedding END,
    updated_at = now()
WHERE (m.expires_at IS NOT NULL AND m.expires_at <= now()) OR jsonb_typeof(m.value) = 'number'
RETURNING value::text, expires_at
"""


def memory_incr(
    *, slot: Slot, key: str, delta: int = 1, ttl_seconds: int | None = None, quota_bytes: int | None = None
) -> tuple[int | float, datetime | None]:
    """Add `delta` atomically; returns (new value, expires_at). NotANumber when the
    live value is not a JSON number (it is left untouched)."""
    quota = settings.LOOMCYCLE.memory_max_scope_bytes if quota_bytes is None else quota_bytes
    params: dict[str, Any] = {
        "tenant": slot.tenant_id,
        "scope": slot.scope,
        "scope_id": slot.scope_id,
        "key": key,
        "delta": delta,
        "expires_at": _expiry(ttl_seconds),
        "has_ttl": bool(ttl_seconds),
    }
    with transaction.atomic():
        _lock_slot(slot)
        _check_quota(slot, key, 20, quota)  # a counter is at most ~20 bytes of JSON
        with connection.cursor() as cursor:
            cursor.execute(_INCR_SQL, params)
            row = cursor.fetchone()
    if row is None:
        raise NotANumber("existing value is not a JSON number")
    number = json.loads(row[0])
    return number, row[1]


def memory_expired_sweep(*, batch: int = SWEEP_BATCH) -> int:
    """Delete expired rows, `batch` at a time so no statement holds many row
    locks; SKIP LOCKED lets overlapping sweeps and live writers pass. Returns rows deleted."""
    deleted = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {_TABLE} WHERE id IN (SELECT id FROM {_TABLE}"
                " WHERE expires_at <= now() ORDER BY expires_at LIMIT %s FOR UPDATE SKIP LOCKED)",
                [batch],
            )
            count = int(cursor.rowcount)
        deleted += count
        if count < batch:
            return deleted
