"""The substrate's part of a snapshot (apps.snapshots): agent definitions,
every version of every tenant, and their pointers (SPEC 4.6 `agent_defs`,
`agent_def_active`).

Def ids are minted per instance, so the same yaml agent has one id on the
instance that captured and another on the one that restores. A restore
therefore maps each snapshot def id to a def of this instance:

- the same id already here: itself (a second restore writes nothing);
- a def here with the same (tenant, name, content_sha256): that one (the
  yaml agents both instances loaded);
- otherwise the row is inserted under its own id, at its own version if that
  is free here, else at the next free version of its name (a run pins its def
  by id and hash, never by version number).

Pointers are insert-or-ignore per (tenant, name): the restoring instance's
own pointers win. Rows are immutable (module docstring of apps.substrate.models),
so nothing is ever updated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Max

from apps.core.errors import Invalid
from apps.core.rows import row_dump, rows_insert_or_ignore
from apps.substrate.models import AgentDef, AgentDefActive


@dataclass(frozen=True)
class AgentDefsRestored:
    """What an agent-def restore wrote, and the def id each snapshot id maps to here."""

    agent_defs_restored: int
    agent_def_active_restored: int
    def_ids: dict[str, str]


def agent_defs_export() -> list[dict[str, Any]]:
    """Every agent def version, oldest first (parents before forks)."""
    rows = AgentDef.objects.order_by("created_at", "version", "id")
    return [row_dump(row) for row in rows.iterator()]


def agent_def_active_export() -> list[dict[str, Any]]:
    """Every agent-def pointer, without its instance-local primary key."""
    rows = AgentDefActive.objects.order_by("tenant_id", "name")
    return [row_dump(row, exclude=("id",)) for row in rows.iterator()]


def _same_here(row: dict[str, Any]) -> str | None:
    """The id of this instance's def that snapshot `row` is, if any."""
    if AgentDef.objects.filter(id=row["id"]).exists():
        return str(row["id"])
    if not row.get("content_sha256"):
        return None
    twin = AgentDef.objects.filter(
        tenant_id=row.get("tenant_id", ""), name=row["name"], content_sha256=row["content_sha256"]
    ).values_list("id", flat=True)
    return next(iter(twin), None)


def _free_version(row: dict[str, Any]) -> int:
    tenant, name, version = row.get("tenant_id", ""), row["name"], int(row["version"])
    if not AgentDef.objects.filter(tenant_id=tenant, name=name, version=version).exists():
        return version
    top = AgentDef.objects.filter(tenant_id=tenant, name=name).aggregate(v=Max("version"))["v"] or 0
    return int(top) + 1


def _checked(row: Any) -> dict[str, Any]:
    if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not isinstance(row.get("name"), str):
        raise Invalid("an agent_defs row needs a string id and name", code="snapshot_invalid")
    if not isinstance(row.get("version"), int):
        raise Invalid(f"agent def {row['id']}: version must be an integer", code="snapshot_invalid")
    return row


def agent_defs_restore(*, defs: list[Any], pointers: list[Any]) -> AgentDefsRestored:
    """Inside the restore's transaction: map or insert every def, then the pointers."""
    ids: dict[str, str] = {}
    written = 0
    # Oldest first: a parent (an earlier version, or the def another name was forked from) is mapped before its forks.
    for row in sorted((_checked(r) for r in defs), key=lambda r: (str(r.get("created_at", "")), int(r["version"]))):
        if (here := _same_here(row)) is not None:
            ids[row["id"]] = here
            continue
        parent = ids.get(row.get("parent_id") or "")
        written += rows_insert_or_ignore(AgentDef, [{**row, "version": _free_version(row), "parent_id": parent}])
        ids[row["id"]] = row["id"]
    return AgentDefsRestored(written, _pointers_restore(pointers, ids), ids)


def _pointers_restore(pointers: list[Any], ids: dict[str, str]) -> int:
    rows = []
    for pointer in pointers:
        if not isinstance(pointer, dict):
            raise Invalid("an agent_def_active row is not an object", code="snapshot_invalid")
        active, static = pointer.get("active_def_id"), pointer.get("static_def_id")
        rows.append({**pointer, "active_def_id": ids.get(active or ""), "static_def_id": ids.get(static or "")})
    return rows_insert_or_ignore(AgentDefActive, rows)
