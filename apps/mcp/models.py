"""The MCP client's tool cache: what `tools/list` answered for one MCPServerDef
version (a def row is immutable, so its `def_id` keys the cache; a new version
is discovered anew). Every process offers the tools stored here, so a worker
never connects to a server to learn its tools, only to call one. Written only by
apps.mcp.services."""

from __future__ import annotations

from django.db import models


class DiscoveredTools(models.Model):
    def_id = models.CharField(max_length=40, unique=True)  # apps.substrate MCPServerDef.id
    tenant_id = models.CharField(max_length=128, default="", blank=True, db_index=True)  # "" = shared
    server = models.CharField(max_length=128)  # the def's name
    tools = models.JSONField(default=list)  # [{name, description, input_schema}], as the server listed them
    error = models.TextField(default="", blank=True)  # why the last discovery failed ("" = it succeeded)
    discovered_at = models.DateTimeField()

    class Meta:
        verbose_name = "discovered MCP tools"
        verbose_name_plural = "discovered MCP tools"

    def __str__(self) -> str:
        return f"{self.tenant_id or '(shared)'}/{self.server} ({len(self.tools)} tools)"
