"""Memory seed rows from yaml `memory: {entries: [...]}` (SPEC C.1).

Seeding inserts a row only when its (tenant, scope, scope_id, key) is absent
and never updates one: once seeded, a key belongs to the runs that may have
changed it since, and a reboot must not roll that back. To re-seed a value,
delete the key; removing an entry from the yaml leaves its row in place.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Q

from apps.core.errors import Invalid
from apps.memory.models import MemoryEntry, MemoryScope

log = logging.getLogger("loomcycle.memory")

MAX_VALUE_BYTES = 65_536  # LOOMCYCLE_MEMORY_MAX_VALUE_BYTES default (SPEC 6.2)
_ENTRY_FIELDS = frozenset({"scope", "scope_id", "key", "value", "tenant_id"})
_TENANT_RE = re.compile(r"[A-Za-z0-9_-]{0,128}")


@dataclass(frozen=True)
class SeedResult:
    inserted: int
    existing: int


def _invalid(index: int, message: str) -> Invalid:
    return Invalid(f"memory.entries[{index}]: {message}", code="config_invalid")


def _entry(index: int, raw: Any) -> MemoryEntry:
    if not isinstance(raw, dict):
        raise _invalid(index, "must be a mapping with scope, scope_id, key and value")
    unknown = sorted(set(raw) - _ENTRY_FIELDS)
    if unknown:
        log.warning("memory.entries[%d]: ignoring fields this build does not know: %s", index, unknown)
    scope, scope_id, key = raw.get("scope"), raw.get("scope_id", ""), raw.get("key")
    tenant_id = raw.get("tenant_id", "")
    if scope not in MemoryScope.values:
        raise _invalid(index, f"scope must be one of {', '.join(MemoryScope.values)} (got {scope!r})")
    if not isinstance(scope_id, str) or not isinstance(tenant_id, str) or not _TENANT_RE.fullmatch(tenant_id):
        raise _invalid(index, "scope_id must be a string and tenant_id match [A-Za-z0-9_-]{0,128}")
    if scope in (MemoryScope.AGENT, MemoryScope.USER) and not scope_id:
        raise _invalid(index, f"scope {scope} needs a scope_id (the {'agent name' if scope == 'agent' else 'user id'})")
    if scope in (MemoryScope.TENANT, MemoryScope.GLOBAL) and scope_id:
        raise _invalid(index, f"scope {scope} takes no scope_id (got {scope_id!r})")
    if not isinstance(key, str) or not key or len(key) > 512:
        raise _invalid(index, "key must be a non-empty string of at most 512 characters")
    if raw.get("value") is None:
        raise _invalid(index, f"{key!r}: value is required (any JSON value but null)")
    size = len(json.dumps(raw["value"], separators=(",", ":")).encode())
    if size > MAX_VALUE_BYTES:
        raise _invalid(index, f"{key!r}: value is {size} bytes, over the {MAX_VALUE_BYTES}-byte limit")
    return MemoryEntry(tenant_id=tenant_id, scope=scope, scope_id=scope_id, key=key, value=raw["value"])


def memory_seeds_from_config(config: dict[str, Any]) -> list[MemoryEntry]:
    """Validate `memory.entries`; raises Invalid(config_invalid). Nothing is saved."""
    block = config.get("memory") or {}
    if not isinstance(block, dict):
        raise Invalid("`memory:` must be a mapping", code="config_invalid")
    raw_entries = block.get("entries") or []
    if not isinstance(raw_entries, list):
        raise Invalid("`memory.entries:` must be a list of {scope, scope_id, key, value}", code="config_invalid")
    entries, seen = [], set()
    for index, raw in enumerate(raw_entries):
        entry = _entry(index, raw)
        identity = (entry.tenant_id, entry.scope, entry.scope_id, entry.key)
        if identity in seen:
            raise _invalid(index, f"duplicate seed for {entry.scope}:{entry.scope_id}/{entry.key}")
        seen.add(identity)
        entries.append(entry)
    return entries


@transaction.atomic
def memory_entries_seed(*, config: dict[str, Any]) -> SeedResult:
    """Insert the yaml seeds that are absent. Idempotent; never overwrites."""
    entries = memory_seeds_from_config(config)
    if not entries:
        return SeedResult(inserted=0, existing=0)
    match = Q()
    for e in entries:
        match |= Q(tenant_id=e.tenant_id, scope=e.scope, scope_id=e.scope_id, key=e.key)
    existing = MemoryEntry.objects.filter(match).count()
    # ON CONFLICT DO NOTHING on the unique (tenant, scope, scope_id, key): a
    # concurrent boot or a run that wrote the key first wins.
    MemoryEntry.objects.bulk_create(entries, ignore_conflicts=True)
    inserted = len(entries) - existing
    if inserted:
        log.info("memory: seeded %d entr%s from yaml", inserted, "y" if inserted == 1 else "ies")
    return SeedResult(inserted=inserted, existing=len(entries) - inserted)
