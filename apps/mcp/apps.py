"""MCP on both sides: MCP servers' tools offered to agents (the client), and the
runtime itself served over MCP (`/v1/_mcp` and `manage.py mcp`).

Client tools register with the tool registry (apps.core.toolregistry) at `AppConfig.ready()`, like
every other app's tools, so the engine never imports this app.
"""

from django.apps import AppConfig


class McpConfig(AppConfig):
    name = "apps.mcp"
    label = "mcp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.mcp.client import install

        install()  # the client: a tool provider, MCPServerDef ops, the list_changed listener
