"""Substrate writes, the same for every versioned kind (SPEC 5.1).

Invariants:
- versions per (tenant, name) start at 1 and increase; writers of one
  (kind, tenant, name) are serialised by a transaction-scoped advisory lock;
- rows are immutable but for `retired`; a change is a new version;
- the pointer per (tenant, name) names the active version and, in the shared
  tenant, the static yaml entry; yaml rows are never retired or replaced
  through the API (create on a static name is refused: fork it);
- a fork may narrow its tool list, never widen it past the lineage root
  (the static yaml entry for a static name, else the v1 row).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max
from django.utils import timezone

from apps.core import privileged
from apps.core.errors import Invalid
from apps.core.http import db_call
from apps.core.ids import new_def_id
from apps.substrate import quotas
from apps.substrate.kinds import KINDS, Kind, Refused, RefusedNotFound, check_def_name, get_kind
from apps.substrate.kinds.secretrefs import check_definition, redacted
from apps.substrate.models import AgentDef, DefPointer, DefSource, VersionedDef
from apps.substrate.signals import version_activated
from apps.substrate.skills import skill_pattern_allows

log = logging.getLogger("loomcycle.substrate")

_LINEAGE_MAX_HOPS = 100
_SERVER_FIELDS = frozenset(
    {"def_id", "version", "parent_def_id", "created_at", "created_by_agent_id", "created_by_run_id"}
    | {"bootstrapped_from_static", "retired", "content_sha256", "promoted", "tenant_id", "source"}
)


@dataclass(frozen=True)
class Author:
    """Who performs a def op. The operator plane (REST, admin, CLI) has no
    tool ceiling and no name scopes; an agent has both."""

    tenant_id: str
    subject: str
    is_admin: bool = False
    agent_id: str = ""
    run_id: str = ""
    self_name: str = ""
    tools_ceiling: tuple[str, ...] | None = None  # None: operator plane
    name_scopes: tuple[str, ...] | None = None  # None: any name

    def sees(self, tenant_id: str) -> bool:
        return self.is_admin or tenant_id in ("", self.tenant_id)

    def owns(self, tenant_id: str) -> bool:
        return self.is_admin or tenant_id == self.tenant_id

    def definition_of(self, kind: Kind, row: VersionedDef) -> dict[str, Any]:
        """`row.definition` as this author may see it: secret fields masked
        unless the author owns the row (apps.substrate.kinds.secretrefs)."""
        return row.definition if self.owns(row.tenant_id) else redacted(kind, row.definition)


def operator_author(principal: Any) -> Author:
    return Author(
        tenant_id=principal.tenant_id,
        subject=principal.subject,
        is_admin=principal.is_admin,
        agent_id="a_http-admin",
    )


# --- helpers -------------------------------------------------------------------


def _lock(kind: Kind, tenant_id: str, name: str) -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"def:{kind.key}:{tenant_id}:{name}"])


def _pointer(kind: Kind, tenant_id: str, name: str) -> DefPointer | None:
    pointer: DefPointer | None = (
        kind.pointer._default_manager.select_related("active_def", "static_def")
        .filter(tenant_id=tenant_id, name=name)
        .first()
    )
    return pointer


def static_row(kind: Kind, name: str) -> VersionedDef | None:
    pointer = _pointer(kind, "", name)
    return pointer.static_def if pointer is not None else None


def _active_row(kind: Kind, tenant_id: str, name: str) -> VersionedDef | None:
    pointer = _pointer(kind, tenant_id, name)
    return pointer.active_def if pointer is not None else None


def _set_active(kind: Kind, row: VersionedDef, by: str) -> None:
    """Point (tenant, name) at `row` and announce it (signals.version_activated)."""
    previous = _pointer(kind, row.tenant_id, row.name)
    previous_id = previous.active_def_id if previous is not None else None
    at = timezone.now()
    kind.pointer._default_manager.update_or_create(
        tenant_id=row.tenant_id,
        name=row.name,
        defaults={"active_def": row, "promoted_at": at, "promoted_by": by},
    )
    version_activated.send(sender=kind.key, def_id=row.id, previous_def_id=previous_id, at=at)


def _check_scope(kind: Kind, author: Author, name: str) -> None:
    if author.name_scopes is None:
        return
    if not author.name_scopes:
        field = "skills" if kind.key == "skill" else f"{kind.key}_def_scopes"
        raise Refused(f"{kind.tool} tool: agent has no {field} (default-deny); add `{field}: [...]` to the agent")
    for scope in author.name_scopes:
        if scope in ("any", "descendants") or (scope == "self" and name == author.self_name):
            return
        if scope.startswith("named:") and scope[len("named:") :] == name:
            return
        if kind.key == "skill" and skill_pattern_allows(scope, name):
            return
    raise Refused(f"{kind.tool} tool: name {name!r} is not in this agent's scopes {list(author.name_scopes)}")


def _overlay(data: dict[str, Any]) -> dict[str, Any]:
    overlay = data.get("overlay")
    if overlay is None:
        return {}
    if not isinstance(overlay, dict):
        raise Refused("overlay must be a JSON object")
    return {k: v for k, v in overlay.items() if k not in _SERVER_FIELDS}


def _flag(data: dict[str, Any], key: str, default: bool) -> bool:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise Refused(f"{key} must be true or false")
    return value


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key) or ""
    if not isinstance(value, str):
        raise Refused(f"{key} must be a string")
    return value


def _check_caps(kind: Kind, definition: dict[str, Any], description: str) -> None:
    conf = settings.LOOMCYCLE
    size = len(json.dumps(definition, separators=(",", ":")).encode())
    if kind.key == "skill":
        body = len(str(definition.get("body", "")).encode())
        cap = conf.skill_def_max_body_bytes
        if cap and body > cap:
            raise Refused(f"body ({body} bytes) exceeds max {cap}")
    elif conf.agent_def_max_definition_bytes and size > conf.agent_def_max_definition_bytes:
        raise Refused(f"definition ({size} bytes) exceeds max {conf.agent_def_max_definition_bytes}")
    cap = conf.agent_def_max_description_bytes
    if cap and len(description.encode()) > cap:
        raise Refused(f"description ({len(description.encode())} bytes) exceeds max {cap}")


def _tools_subset(proposed: list[str], ceiling: list[str] | tuple[str, ...], what: str) -> None:
    if "*" in ceiling:
        return
    allowed = set(ceiling)
    for tool in proposed:
        if tool not in allowed:
            raise Refused(f"tools cannot widen: {tool!r} is not in {what} {sorted(allowed)}")


def _check_privileged(kind: Kind, tenant_id: str, definition: dict[str, Any]) -> None:
    """A written row is never the operator's yaml: it may name Bash or a host tool only when
    its tenant is listed (apps.core.privileged)."""
    tools = definition.get(kind.tools_field) if kind.tools_field else None
    refused = privileged.refusal(tools if isinstance(tools, list) else [], tenant_id=tenant_id)
    if refused:
        raise Refused(refused)


def _lineage_root(kind: Kind, row: VersionedDef) -> VersionedDef:
    current = row
    for _ in range(_LINEAGE_MAX_HOPS):
        if current.parent_id is None:
            return current
        current = kind.model._default_manager.get(id=current.parent_id)
    raise Refused(f"lineage of {row.name!r} is deeper than {_LINEAGE_MAX_HOPS} hops; refusing")


def _insert(
    kind: Kind,
    author: Author,
    *,
    tenant_id: str,
    name: str,
    definition: dict[str, Any],
    description: str,
    parent: VersionedDef | None,
    source: str = DefSource.RUNTIME,
    bootstrapped: bool = False,
) -> VersionedDef:
    versions = kind.model._default_manager.filter(tenant_id=tenant_id, name=name)
    if source != DefSource.YAML and not versions.filter(retired=False).exists():
        quotas.check_new_name(kind, tenant_id)  # the name takes a place in the tenant's count (the yaml's do not)
    top = versions.aggregate(v=Max("version"))["v"] or 0
    created: VersionedDef = kind.model._default_manager.create(
        id=new_def_id(),
        tenant_id=tenant_id,
        name=name,
        version=top + 1,
        parent=parent,
        definition=definition,
        description=description,
        content_sha256=kind.content_hash(name, definition) if kind.content_hash else "",
        source=source,
        bootstrapped_from_static=bootstrapped,
        created_by=author.subject,
        created_by_agent_id=author.agent_id,
        created_by_run_id=author.run_id,
    )
    return created


def row_out(row: VersionedDef, *, promoted: bool | None = None) -> dict[str, Any]:
    created = row.created_at.astimezone(UTC) if row.created_at else None
    out: dict[str, Any] = {
        "def_id": row.id,
        "name": row.name,
        "version": row.version,
        "parent_def_id": row.parent_id or "",
        "description": row.description,
        "created_at": created.strftime("%Y-%m-%dT%H:%M:%S.") + f"{created.microsecond * 1000:09d}Z" if created else "",
        "created_by_agent_id": row.created_by_agent_id,
        "retired": row.retired,
        "bootstrapped_from_static": row.bootstrapped_from_static,
        "content_sha256": row.content_sha256,
        "definition": row.definition,
        "tenant_id": row.tenant_id,
        "source": row.source,
    }
    if promoted is not None:
        out["promoted"] = promoted
    return out


def _visible_row(kind: Kind, author: Author, def_id: Any, op: str) -> VersionedDef:
    if not isinstance(def_id, str) or not def_id:
        raise Refused(f"{op}: missing required field: def_id")
    row = kind.model._default_manager.filter(id=def_id).first()
    if row is None or not author.sees(row.tenant_id):
        raise RefusedNotFound(f"{op}: def_id {def_id!r} not found")
    found: VersionedDef = row
    return found


# --- ops -----------------------------------------------------------------------


@transaction.atomic
def def_create(kind: Kind, author: Author, data: dict[str, Any]) -> dict[str, Any]:
    name = check_def_name(data.get("name"))
    _check_scope(kind, author, name)
    if static_row(kind, name) is not None:
        raise Refused(f"create: name {name!r} matches a static yaml entry; use `fork` to derive a new version")
    description = _text(data, "description")
    definition = kind.normalise(name, {k: v for k, v in _overlay(data).items() if v is not None}, True)
    check_definition(kind, author.tenant_id, name, definition)
    if kind.tools_field and author.tools_ceiling is not None:
        _tools_subset(definition.get(kind.tools_field, []), author.tools_ceiling, "the caller's own tools")
    _check_privileged(kind, author.tenant_id, definition)
    _check_caps(kind, definition, description)
    quotas.check_definition(kind, definition)
    promote = _flag(data, "promote", True)
    tenant_id = author.tenant_id
    _lock(kind, tenant_id, name)
    active = _active_row(kind, tenant_id, name)
    if active is not None and not active.retired and active.definition == definition:
        out = row_out(active, promoted=True)
        out["deduplicated"] = True
        return out
    row = _insert(
        kind, author, tenant_id=tenant_id, name=name, definition=definition, description=description, parent=None
    )
    if promote:
        _set_active(kind, row, author.subject)
    return row_out(row, promoted=promote)


def _fork_parent(kind: Kind, author: Author, name: str, parent_def_id: Any) -> VersionedDef:
    """Explicit parent -> own tenant's active -> shared active -> static entry."""
    if parent_def_id:
        parent = _visible_row(kind, author, parent_def_id, "fork")
        if parent.name != name:
            raise Refused(f"fork: parent_def_id {parent.id!r} has name {parent.name!r}, not {name!r}")
        return parent
    own = _active_row(kind, author.tenant_id, name)
    if own is not None:
        return own
    if author.tenant_id:
        shared = _active_row(kind, "", name)
        if shared is not None and shared.source != DefSource.YAML:
            return shared
    static = static_row(kind, name)
    if static is None:
        raise Refused(f"fork: no parent: name {name!r} has neither a version nor a static yaml entry")
    if not author.tenant_id:
        return static  # the shared tenant already holds the yaml entry as a version
    existing = kind.model._default_manager.filter(
        tenant_id=author.tenant_id, name=name, bootstrapped_from_static=True
    ).first()
    if existing is not None:
        found: VersionedDef = existing
        return found
    return _insert(
        kind,
        author,
        tenant_id=author.tenant_id,
        name=name,
        definition=author.definition_of(kind, static),
        description="bootstrapped from the static yaml entry",
        parent=None,
        bootstrapped=True,
    )


@transaction.atomic
def def_fork(kind: Kind, author: Author, data: dict[str, Any]) -> dict[str, Any]:
    name = check_def_name(data.get("name"))
    _check_scope(kind, author, name)
    description = _text(data, "description")
    promote = _flag(data, "promote", kind.fork_promotes)
    _lock(kind, author.tenant_id, name)
    parent = _fork_parent(kind, author, name, data.get("parent_def_id"))
    merged = {**author.definition_of(kind, parent), **_overlay(data)}
    definition = kind.normalise(name, {k: v for k, v in merged.items() if v is not None}, True)  # null removes a field
    check_definition(kind, author.tenant_id, name, definition)
    if kind.tools_field:
        static = static_row(kind, name)
        root = static if static is not None else _lineage_root(kind, parent)
        ceiling = root.definition.get(kind.tools_field, [])
        _tools_subset(definition.get(kind.tools_field, []), ceiling, "the lineage root's tools")
    _check_privileged(kind, author.tenant_id, definition)
    _check_caps(kind, definition, description)
    quotas.check_definition(kind, definition)
    row = _insert(
        kind,
        author,
        tenant_id=author.tenant_id,
        name=name,
        definition=definition,
        description=description,
        parent=parent,
    )
    if promote:
        _set_active(kind, row, author.subject)
    return row_out(row, promoted=promote)


def def_get(kind: Kind, author: Author, data: dict[str, Any]) -> dict[str, Any]:
    row = _visible_row(kind, author, data.get("def_id"), "get")
    _check_scope(kind, author, row.name)
    pointer = _pointer(kind, row.tenant_id, row.name)
    out = row_out(row, promoted=pointer is not None and pointer.active_def_id == row.id)
    out["definition"] = author.definition_of(kind, row)
    return out


def def_list(kind: Kind, author: Author, data: dict[str, Any]) -> dict[str, Any]:
    name = check_def_name(data.get("name"))
    _check_scope(kind, author, name)
    tenant_id = author.tenant_id
    if author.is_admin and isinstance(data.get("tenant_id"), str):
        tenant_id = data["tenant_id"]
    pointer = _pointer(kind, tenant_id, name)
    active_id = pointer.active_def_id if pointer is not None else None
    rows = kind.model._default_manager.filter(tenant_id=tenant_id, name=name).order_by("-version")
    return {"name": name, "versions": [row_out(r, promoted=r.id == active_id) for r in rows]}


@transaction.atomic
def def_retire(kind: Kind, author: Author, data: dict[str, Any]) -> dict[str, Any]:
    row = _visible_row(kind, author, data.get("def_id"), "retire")
    retired = data.get("retired")
    if not isinstance(retired, bool):
        raise Refused("retire: missing required field: retired (true|false)")
    if not author.owns(row.tenant_id):
        raise RefusedNotFound(f"retire: def_id {row.id!r} not found")
    _check_scope(kind, author, row.name)
    if row.source == DefSource.YAML:
        raise Refused(f"retire: {row.name!r} v{row.version} is a static yaml entry; edit loomcycle.yaml instead")
    siblings = kind.model._default_manager.filter(tenant_id=row.tenant_id, name=row.name, retired=False)
    if not retired and row.retired and not siblings.exists():  # the name takes its place in the count again
        quotas.check_new_name(kind, row.tenant_id)
    kind.model._default_manager.filter(id=row.id).update(retired=retired)
    pointer = _pointer(kind, row.tenant_id, row.name)
    if row.retired and not retired and pointer is not None and pointer.active_def_id == row.id:
        version_activated.send(sender=kind.key, def_id=row.id, previous_def_id=row.id, at=timezone.now())
    return {"def_id": row.id, "retired": retired}


def def_retire_auto(kind: Kind, *, def_id: str) -> bool:
    """Retire `def_id` on the runtime's own behalf (a ScheduleDef that reached
    `max_fires`): no author, scope or yaml check. True if this call retired it."""
    return bool(kind.model._default_manager.filter(id=def_id, retired=False).update(retired=True))


@transaction.atomic
def def_promote(kind: Kind, author: Author, data: dict[str, Any]) -> dict[str, Any]:
    row = _visible_row(kind, author, data.get("def_id"), "promote")
    if not author.owns(row.tenant_id):
        raise RefusedNotFound(f"promote: def_id {row.id!r} not found")
    _check_scope(kind, author, row.name)
    if row.retired:
        raise Refused(f"promote: def_id {row.id!r} is retired; un-retire it first")
    _lock(kind, row.tenant_id, row.name)
    _set_active(kind, row, author.subject)
    return {"def_id": row.id, "name": row.name, "promoted": True}


def def_verify(kind: Kind, author: Author, data: dict[str, Any]) -> dict[str, Any]:
    name = check_def_name(data.get("name"))
    _check_scope(kind, author, name)
    claimed = _text(data, "content_sha256")
    row = _active_row(kind, author.tenant_id, name) or (_active_row(kind, "", name) if author.tenant_id else None)
    if row is None or row.retired:
        return {
            "matches": False,
            "current_sha256": "",
            "current_def_id": "",
            "version": 0,
            "name": name,
            "deployed": False,
        }
    return {
        "matches": bool(claimed) and claimed == row.content_sha256,
        "current_sha256": row.content_sha256,
        "current_def_id": row.id,
        "version": row.version,
        "name": name,
        "deployed": True,
    }


OPS = {
    "create": def_create,
    "fork": def_fork,
    "get": def_get,
    "list": def_list,
    "retire": def_retire,
    "promote": def_promote,
    "verify": def_verify,
}
DefOp = Callable[[Kind, Author, dict[str, Any]], dict[str, Any]]
AsyncDefOp = Callable[[Kind, Author, dict[str, Any]], Awaitable[dict[str, Any]]]
_EXTRA_OPS: dict[str, dict[str, DefOp]] = {}  # kind key -> op -> function, for kind-specific ops
# kind key -> op -> coroutine function: the twin of an extra op that waits on something
# outside the process (an MCP server's discovery), which def_dispatch_async awaits on its loop.
_ASYNC_OPS: dict[str, dict[str, AsyncDefOp]] = {}


def def_ops_register(kind_key: str, ops: dict[str, DefOp], async_ops: dict[str, AsyncDefOp] | None = None) -> None:
    """Add (or override) ops of one kind, from an AppConfig.ready(): ScheduleDef's hooks
    (apps.substrate.hookops), MCPServerDef's discovery (apps.mcp). Idempotent."""
    _EXTRA_OPS.setdefault(kind_key, {}).update(ops)
    _ASYNC_OPS.setdefault(kind_key, {}).update(async_ops or {})


def def_dispatch(kind: Kind, author: Author, data: Any) -> dict[str, Any]:
    """Run one op-dispatch body (`{"op": ...}`) for `kind`. Raises Refused."""
    if not isinstance(data, dict):
        raise Refused("input must be a JSON object")
    op = data.get("op")
    if not op:
        raise Refused("missing required field: op")
    fn = _EXTRA_OPS.get(kind.key, {}).get(op) or (OPS.get(op) if op in kind.ops else None)
    if fn is None:
        known = sorted(kind.ops | set(_EXTRA_OPS.get(kind.key, {})))
        raise Refused(f"unknown op {op!r} (must be one of: {', '.join(known)})")
    result: dict[str, Any] = fn(kind, author, data)
    return result


async def def_dispatch_async(kind: Kind, author: Author, data: Any) -> dict[str, Any]:
    """def_dispatch for an async transport (REST, the MCP server), the one entry both await.
    An op with an async twin (def_ops_register) is awaited on the caller's loop, so its wait on the outside
    holds no thread of the process; any other op runs def_dispatch on a worker thread (its
    DB connection handed back after). Raises Refused."""
    op = data.get("op") if isinstance(data, dict) else None
    waits = _ASYNC_OPS.get(kind.key, {}).get(op) if isinstance(op, str) else None
    if waits is not None:
        return await waits(kind, author, data)
    return await db_call(def_dispatch)(kind, author, data)


# --- yaml (static) definitions ---------------------------------------------------


@transaction.atomic
def def_sync_static(kind: Kind, *, name: str, raw: Any) -> VersionedDef:
    """Make the yaml entry `name` the static def of the shared tenant.
    Idempotent: the same content keeps the same row. A changed entry is a
    new version; the active pointer follows it unless a runtime version was
    promoted over it."""
    try:
        check_def_name(name)
        if not isinstance(raw, dict):
            raise Refused(f"{kind.key} {name!r}: definition must be a mapping")
        definition = kind.normalise(name, raw, False)
    except Refused as exc:
        raise Invalid(exc.message, code="config_invalid") from exc
    _lock(kind, "", name)
    pointer = _pointer(kind, "", name)
    static = pointer.static_def if pointer is not None else None
    active = pointer.active_def if pointer is not None else None
    if static is not None and static.definition == definition:
        row = static
    else:
        row = kind.model._default_manager.filter(
            tenant_id="", name=name, source=DefSource.YAML, definition=definition
        ).first()
        if row is None:
            yaml_author = Author(tenant_id="", subject="yaml")
            row = _insert(
                kind,
                yaml_author,
                tenant_id="",
                name=name,
                definition=definition,
                description=str(definition.get("description", "")),
                parent=static or active,
                source=DefSource.YAML,
            )
    defaults: dict[str, Any] = {"static_def": row}
    if active is None or active.source == DefSource.YAML:
        defaults |= {"active_def": row, "promoted_at": timezone.now(), "promoted_by": "yaml"}
    kind.pointer._default_manager.update_or_create(tenant_id="", name=name, defaults=defaults)
    synced: VersionedDef = row
    return synced


def defs_unload_static(kind: Kind, keep: set[str]) -> list[str]:
    """Names whose yaml entry is gone lose their static pointer (and the
    active one when it pointed at the yaml row)."""
    gone = []
    for pointer in kind.pointer._default_manager.select_related("active_def").filter(
        tenant_id="", static_def__isnull=False
    ):
        if pointer.name in keep:
            continue
        updates: dict[str, Any] = {"static_def": None}
        if pointer.active_def is not None and pointer.active_def.source == DefSource.YAML:
            updates["active_def"] = None
        kind.pointer._default_manager.filter(pk=pointer.pk).update(**updates)
        gone.append(pointer.name)
    return gone


def defs_load_yaml(*, config: dict[str, Any]) -> dict[str, list[VersionedDef]]:
    """Load every kind's yaml block as static definitions."""
    loaded: dict[str, list[VersionedDef]] = {}
    for kind in KINDS.values():
        block = config.get(kind.yaml_key) or {}
        if not isinstance(block, dict):
            raise Invalid(f"`{kind.yaml_key}:` must be a mapping of name -> definition", code="config_invalid")
        rows = [def_sync_static(kind, name=str(name), raw=raw) for name, raw in block.items()]
        gone = defs_unload_static(kind, {str(n) for n in block})
        if gone:
            log.info("%s: yaml entries removed: %s", kind.yaml_key, gone)
        loaded[kind.key] = rows
    return loaded


# Compatibility wrappers used by the run engine's tests and boot.


def agent_def_sync_static(*, name: str, raw: Any) -> AgentDef:
    row = def_sync_static(get_kind("agent"), name=name, raw=raw)
    assert isinstance(row, AgentDef)
    return row


def agent_defs_load_yaml(*, config: dict[str, Any]) -> list[AgentDef]:
    rows = defs_load_yaml(config=config)["agent"]
    return [r for r in rows if isinstance(r, AgentDef)]
