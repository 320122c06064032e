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
