"""`manage.py mcp`: the runtime's MCP server over stdio, for desktop MCP clients.

Local (default): the same tools as `/v1/_mcp` (apps.mcp.server), over this
machine's runtime (its database and Redis), for the principal of `--token`
(or the LOOMCYCLE_TOKEN variable: the client's credential, not server
configuration), or the open-mode principal when the runtime has no token.
The token is checked once at start, with the REST API's auth and scope gate
for `/v1/_mcp`; a refusal exits with its code before serving.

Remote (`--url URL`): a thin proxy to another runtime's `/v1/_mcp`, with the
SDK's Streamable HTTP client and `--token` as its bearer: `tools/list` and
`tools/call` are forwarded as they are; nothing here decides what is allowed.
"""

from __future__ import annotations

import os
from contextlib import AsyncExitStack
from typing import Any

import anyio
import httpx2
import mcp_types as types
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from apps.core.errors import ApplicationError
from apps.core.types import Principal
from apps.mcp.server.http import PATH
from apps.mcp.server.server import Ctx, build_server
from apps.substrate.auth import authenticate, authorize

LOOPBACK = "127.0.0.1"  # a stdio client runs on this machine


def local_principal(token: str | None) -> Principal:
    """The principal of `token` (None: open mode), authorised for /v1/_mcp as over HTTP."""
    try:
        principal = authenticate(token, LOOPBACK)
        authorize(principal, "POST", PATH)
        return principal
    except ApplicationError as exc:
        raise CommandError(f"{exc.code}: {exc.message}") from exc
    finally:
        connection.close()


async def serve(server: Server[Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_proxy(url: str, token: str | None) -> None:
    """Forward tools/list and tools/call to the runtime at `url` over one client session."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with AsyncExitStack() as stack:
        timeout = httpx2.Timeout(30, read=600)  # a spawn_run with wait holds its response open
        http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=timeout))
        remote = await stack.enter_async_context(Client(streamable_http_client(url, http_client=http), cache=None))

        async def list_tools(ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
            return await remote.list_tools(cursor=params.cursor if params else None)

        async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
            return await remote.call_tool(params.name, params.arguments)

        await serve(Server("loomcycle-proxy", version="1", on_list_tools=list_tools, on_call_tool=call_tool))


class Command(BaseCommand):
    help = "Serve the runtime's MCP tools over stdio (locally, or as a proxy of a remote runtime's /v1/_mcp)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--token", default=None, help="bearer token (default: the LOOMCYCLE_TOKEN variable)")
        parser.add_argument("--url", default=None, help="proxy a remote runtime's MCP endpoint (…/v1/_mcp)")

    def handle(self, *args: Any, **options: Any) -> None:
        token = options["token"] or os.environ.get("LOOMCYCLE_TOKEN") or None
        if options["url"]:
            anyio.run(serve_proxy, options["url"], token)
            return
        principal = local_principal(token)
        anyio.run(serve, build_server(lambda ctx: principal))
