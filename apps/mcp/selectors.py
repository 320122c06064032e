"""Reads of the MCP client: the servers a tenant can see (substrate's MCPServerDef
resolution: the tenant's own, then the shared ones, never another tenant's) and
their cached tools."""

from __future__ import annotations

from apps.mcp.models import DiscoveredTools
from apps.substrate.kinds import get_kind
from apps.substrate.models import DefSource, VersionedDef
from apps.substrate.selectors import def_resolve, defs_visible


def servers_visible(*, tenant_id: str) -> dict[str, VersionedDef]:
    """name -> the MCPServerDef version the tenant resolves it to."""
    return defs_visible(get_kind("mcpserver"), tenant_id=tenant_id)


def server_resolve(*, tenant_id: str, name: str) -> VersionedDef | None:
    return def_resolve(get_kind("mcpserver"), tenant_id=tenant_id, name=name)


def server_by_id(*, def_id: str) -> VersionedDef | None:
    """The MCPServerDef version `def_id` (an id the client holds from a row it resolved)."""
    row: VersionedDef | None = get_kind("mcpserver").model._default_manager.filter(id=def_id).first()
    return row


def discovered_for(*, def_ids: list[str]) -> dict[str, DiscoveredTools]:
    """def_id -> its cache row, for those that have one."""
    return {row.def_id: row for row in DiscoveredTools.objects.filter(def_id__in=def_ids)}


def static_servers_undiscovered() -> list[VersionedDef]:
    """The shared yaml servers whose current version has no cache row yet."""
    rows = [row for row in servers_visible(tenant_id="").values() if row.source == DefSource.YAML]
    known = discovered_for(def_ids=[row.id for row in rows])
    return [row for row in rows if row.id not in known]
