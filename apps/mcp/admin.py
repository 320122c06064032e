"""The MCP client's discovered tools in the admin: read-only (discovery writes them;
`POST /v1/_mcpserverdef {"op": "rediscover"}` refreshes one server)."""

from __future__ import annotations

from django.contrib import admin

from apps.core.admin import ReadOnlyAdmin
from apps.mcp.models import DiscoveredTools


@admin.register(DiscoveredTools)
class DiscoveredToolsAdmin(ReadOnlyAdmin):
    list_display = ("tenant_id", "server", "def_id", "tool_names", "error", "discovered_at")
    search_fields = ("tenant_id", "server", "def_id")

    @admin.display(description="tools")
    def tool_names(self, obj: DiscoveredTools) -> str:
        return ", ".join(str(t.get("name", "")) for t in obj.tools)
