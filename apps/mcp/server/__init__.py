"""The runtime served over MCP: `/v1/_mcp` (Streamable HTTP, apps.mcp.server.http)
and `manage.py mcp` (stdio). One tool table (apps.mcp.server.tools) and one
lowlevel SDK `Server` (apps.mcp.server.server) serve both transports.

Invariants: a tool is listed to, and callable by, only a principal holding its
scope (loomcycle hides what a caller may not use); every tool calls the same
services and selectors as the REST route it mirrors, with the caller's
principal, so tenant isolation is the REST API's; no tool adds a rule.
"""
