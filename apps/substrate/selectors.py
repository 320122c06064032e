"""Tenant-scoped substrate reads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from django.db import connection
from django.db.models import Count, Max, Q, QuerySet

from apps.core.errors import NotFound
from apps.core.timefmt import ts
from apps.substrate.kinds import Kind, get_kind
from apps.substrate.models import AgentDef, VersionedDef


def def_resolve(kind: Kind, *, tenant_id: str, name: str) -> VersionedDef | None:
    """SPEC 5.1 lookup order: the tenant's active version, then the static
    yaml entry, then the shared tenant's active version. A retired active
    version is skipped (it resolves as not found at its level)."""
    sql, attnames, converters = _resolve_sql(kind)
    n = len(attnames)
    with connection.cursor() as cur:  # on every run creation: plain SQL, the ORM's compile cost ~1 ms
        cur.execute(sql, [name, tenant_id])
        pointers = {row[0]: (row[1 : 1 + n], row[1 + n :]) for row in cur.fetchall()}

    def load(values: tuple[Any, ...]) -> VersionedDef | None:
        if values[0] is None:  # no version at this level (LEFT JOIN)
            return None
        values = tuple(conv(v, None, connection) if conv else v for conv, v in zip(converters, values, strict=True))
        row: VersionedDef = kind.model.from_db(connection.alias, attnames, values)
        return row

    candidates = []
    if tenant_id and tenant_id in pointers:
        candidates.append(load(pointers[tenant_id][0]))
    if "" in pointers:
        active, static = pointers[""]
        candidates += [load(static), load(active)]
    for found in candidates:
        if found is not None and not found.retired:
            return found
    return None


_RESOLVE_SQL: dict[str, tuple[str, list[str], list[Any]]] = {}


def _resolve_sql(kind: Kind) -> tuple[str, list[str], list[Any]]:
    """The pointer rows of (name, tenant or shared) with their active and
    static versions: all columns of the kind's model, twice. Returns the SQL,
    the model's field attnames and each field's from_db_value (or None)."""
    cached = _RESOLVE_SQL.get(kind.key)
    if cached is None:
        q = connection.ops.quote_name
        fields = list(kind.model._meta.concrete_fields)
        pk = q(kind.model._meta.pk.column)

        def cols(alias: str) -> str:
            return ", ".join(f"{alias}.{q(f.column)}" for f in fields)

        table, ptable = q(kind.model._meta.db_table), q(kind.pointer._meta.db_table)
        active = q(kind.pointer._meta.get_field("active_def").column)
        static = q(kind.pointer._meta.get_field("static_def").column)
        sql = (
            f"SELECT p.tenant_id, {cols('a')}, {cols('s')} FROM {ptable} p"
            f" LEFT JOIN {table} a ON a.{pk} = p.{active} LEFT JOIN {table} s ON s.{pk} = p.{static}"
            " WHERE p.name = %s AND p.tenant_id IN (%s, '')"
        )
        converters = [getattr(f, "from_db_value", None) for f in fields]
        cached = _RESOLVE_SQL[kind.key] = (sql, [f.attname for f in fields], converters)
    return cached


_DEFINITIONS: OrderedDict[str, dict[str, Any]] = OrderedDict()
_DEFINITIONS_LOCK = threading.Lock()
_DEFINITIONS_MAX = 1024


def agent_definition(def_id: str) -> dict[str, Any]:
    """The definition of AgentDef `def_id` ({} if there is none), cached per
    process: a version's definition is never edited (only `retired` changes),
    so the tools' per-call policy reads (memory_scopes, channels,
    evaluation_scopes...) cost no query after the first. Treat it as read-only."""
    with _DEFINITIONS_LOCK:
        found = _DEFINITIONS.get(def_id)
        if found is not None:
            _DEFINITIONS.move_to_end(def_id)
            return found
    definition: dict[str, Any] = AgentDef.objects.filter(id=def_id).values_list("definition", flat=True).first() or {}
    if definition:
        with _DEFINITIONS_LOCK:
            _DEFINITIONS[def_id] = definition
            while len(_DEFINITIONS) > _DEFINITIONS_MAX:
                _DEFINITIONS.popitem(last=False)
    return definition


def agent_def_resolve(*, tenant_id: str, name: str) -> AgentDef:
    row = def_resolve(get_kind("agent"), tenant_id=tenant_id, name=name)
    if row is None:
        raise NotFound(f'unknown agent "{name}"', code="unknown_agent")
    assert isinstance(row, AgentDef)
    return row


def agent_def_ancestors(*, def_id: str, max_hops: int = 100) -> list[str]:
    """The parent chain of AgentDef `def_id`, nearest first, at most `max_hops` ids (a cycle ends it)."""
    out: list[str] = []
    seen = {def_id}
    current: str | None = def_id
    for _ in range(max_hops):
        current = AgentDef.objects.filter(id=current).values_list("parent_id", flat=True).first()
        if not current or current in seen:
            break
        seen.add(current)
        out.append(current)
    return out


def agent_def_is_operator_yaml(*, def_id: str) -> bool:
    """Whether the agent version `def_id` is one of the operator's yaml (VersionedDef.is_operator_yaml)."""
    row = AgentDef.objects.filter(id=def_id).only("tenant_id", "source").first()
    return row is not None and row.is_operator_yaml


def active_defs(kind: Kind, *, tenant_id: str | None = None) -> QuerySet[VersionedDef]:
    """The active, unretired version of every (tenant, name) of `kind` (a lazy
    query, usable as a subquery); `tenant_id` None: every tenant."""
    pointers = kind.pointer._default_manager.filter(active_def__isnull=False)
    if tenant_id is not None:
        pointers = pointers.filter(tenant_id=tenant_id)
    rows: QuerySet[VersionedDef] = kind.model._default_manager.filter(
        id__in=pointers.values("active_def_id"), retired=False
    )
    return rows


def def_names(kind: Kind, *, tenant_id: str | None) -> list[dict[str, Any]]:
    """`GET /v1/_<kind>def/names`: one summary per (tenant, name). `tenant_id`
    None lists every tenant (admins); otherwise the tenant and the shared rows."""
    rows = kind.model._default_manager.all()
    if tenant_id is not None:
        rows = rows.filter(tenant_id__in={tenant_id, ""})
    groups = (
        rows.values("tenant_id", "name")
        .annotate(
            version_count=Count("id"),
            live_version_count=Count("id", filter=Q(retired=False)),
            latest_version=Max("version"),
            last_updated=Max("created_at"),
        )
        .order_by("tenant_id", "name")
    )
    pointers = {
        (p.tenant_id, p.name): p
        for p in kind.pointer._default_manager.select_related("active_def").filter(
            **({} if tenant_id is None else {"tenant_id__in": {tenant_id, ""}})
        )
    }
    out = []
    for g in groups:
        pointer = pointers.get((g["tenant_id"], g["name"]))
        active = pointer.active_def if pointer is not None else None
        out.append(
            {
                "name": g["name"],
                "tenant_id": g["tenant_id"],
                "version_count": g["version_count"],
                "active_def_id": active.id if active is not None else "",
                "latest_version": g["latest_version"],
                "last_updated": ts(g["last_updated"]),
                "live_version_count": g["live_version_count"],
                "active_retired": bool(active is not None and active.retired),
                "static": bool(pointer is not None and pointer.static_def_id),
            }
        )
    return out


def _pick(pointers: dict[str, Any], tenant_id: str, *, static_first: bool) -> VersionedDef | None:
    """The version a name resolves to from its pointer rows (tenant, shared):
    the tenant's active version, then the shared static and active versions
    in the kind's order. A retired version is skipped at its level."""
    own = pointers.get(tenant_id) if tenant_id else None
    shared = pointers.get("")
    candidates = [own.active_def if own is not None else None]
    if shared is not None:
        pair = [shared.static_def, shared.active_def]
        candidates += pair if static_first else pair[::-1]
    return next((row for row in candidates if row is not None and not row.retired), None)


def defs_visible(kind: Kind, *, tenant_id: str) -> dict[str, VersionedDef]:
    """Every name the tenant can resolve, with the version it resolves to:
    the tenant's own and the shared tenant's, never another tenant's. Agents
    resolve as `def_resolve` does (static yaml before a shared runtime fork);
    skills prefer any active version over the static one (SPEC 5.2)."""
    by_name: dict[str, dict[str, Any]] = {}
    for pointer in kind.pointer._default_manager.select_related("active_def", "static_def").filter(
        tenant_id__in={tenant_id, ""}
    ):
        by_name.setdefault(pointer.name, {})[pointer.tenant_id] = pointer
    out = {}
    for name in sorted(by_name):
        row = _pick(by_name[name], tenant_id, static_first=kind.key != "skill")
        if row is not None:
            out[name] = row
    return out


def skill_resolve(*, tenant_id: str, name: str) -> VersionedDef | None:
    """The skill version `name` loads for a tenant: its own active version,
    then the shared active version, then the static yaml one; None if none
    is live (unknown, or every level retired)."""
    kind = get_kind("skill")
    pointers = {
        p.tenant_id: p
        for p in kind.pointer._default_manager.select_related("active_def", "static_def").filter(
            name=name, tenant_id__in={tenant_id, ""}
        )
    }
    return _pick(pointers, tenant_id, static_first=False)


def def_name_exists(kind: Kind, *, tenant_id: str, name: str) -> bool:
    """Whether the tenant (or the shared tenant) has any version of `name`, live or retired."""
    found: bool = kind.model._default_manager.filter(name=name, tenant_id__in={tenant_id, ""}).exists()
    return found
