"""The MCP client: MCP servers' tools offered to agents as `mcp__<server>__<tool>`.

- `transport`: the SDK's HTTP stack (httpx2) over the SSRF guard of apps.core.egress;
- `sessions`: one event-loop thread per process owning the open sessions (stdio
  processes and streamable HTTP sessions), bounded and stopped with the process;
- `calls`: the synchronous entry points the engine's tool threads, discovery and
  on_complete hooks use (a call waits on a future, never holding a DB connection), and
  `alist_tools`, discovery for the web process's event loop (it holds no thread);
- `servers`: an MCPServerDef row made into what a session needs, per run;
- `provider`: the tool registry's provider (apps.core.toolregistry) (the cached tools of the servers a
  tenant can see).
"""


def install() -> None:
    """Wire the client into the runtime (from McpConfig.ready(); idempotent)."""
    from apps.core import toolregistry
    from apps.mcp import services
    from apps.mcp.client import calls
    from apps.mcp.tools import PREFIX, mcp_tools
    from apps.substrate import services as substrate_services

    toolregistry.register_provider(mcp_tools, prefix=PREFIX)
    calls.set_tools_listener(services.tools_relisted)
    calls.connect_worker_shutdown()
    substrate_services.def_ops_register(
        "mcpserver",
        {
            "create": services.mcpserver_create,
            "fork": services.mcpserver_fork,
            "rediscover": services.mcpserver_rediscover,
        },
        {
            "create": services.amcpserver_create,
            "fork": services.amcpserver_fork,
            "rediscover": services.amcpserver_rediscover,
        },
    )
