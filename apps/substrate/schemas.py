"""The definition op's input (SPEC 6.5), one schema for every transport that runs def ops:
REST (`POST /v1/_<kind>def`, apps/substrate/api.py), the MCP server's def tools
(apps/mcp/server/tools_admin.py) and gRPC parse a body with it, then call
`services.def_dispatch_async`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class DefOpIn(BaseModel):
    """The def tools' common input (SPEC 6.5); each op reads what it needs, others pass through."""

    model_config = ConfigDict(extra="allow")

    op: str = Field(description="create | fork | get | list | retire | promote | verify, or one of the kind's own")
    name: Any = None
    def_id: Any = None
    parent_def_id: Any = None
    overlay: Any = None
    description: Any = None
    promote: Any = None
    retired: Any = None
    content_sha256: Any = None


class DefNameOut(BaseModel):
    """One (tenant, name) of a def kind: its versions and the active one (selectors.def_names)."""

    name: str
    tenant_id: str
    version_count: int
    active_def_id: str  # "" when no version is active
    latest_version: int
    last_updated: str | None
    live_version_count: int
    active_retired: bool
    static: bool | None = None  # the def kinds' (a yaml-declared version); operator tokens have none


class DefNamesOut(BaseModel):
    names: list[DefNameOut]


class DefOpOut(BaseModel):
    """The def tool's JSON answer to the op (create, get, list, activate, retire, ...): its fields
    depend on the op, as the tool's own result does (docs/api.md, "Definitions")."""

    model_config = ConfigDict(extra="allow")
