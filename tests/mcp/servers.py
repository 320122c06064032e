"""A streamable-HTTP MCP server for the tests, built with the official SDK
(`MCPServer`) and served by uvicorn on a loopback port in a thread of the test
process. It records the Authorization header of every request it gets; `garble` fails
with a NUL in its error; its
`grow` tool adds a tool and tells the caller its list changed; `wait` sets `WAITING`
and sleeps (the cancel test)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Recorder:
    """ASGI middleware keeping (Host, Authorization) of each HTTP request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            self.seen.append((headers.get(b"host", b"").decode(), headers.get(b"authorization", b"").decode()))
        await self.app(scope, receive, send)

    def authorizations(self, host: str) -> set[str]:
        """The Authorization values of the requests addressed to `host` (any port)."""
        return {auth for seen_host, auth in self.seen if seen_host.rsplit(":", 1)[0] == host}


WAITING = threading.Event()  # set when a `wait` call has started


def build() -> MCPServer:
    server = MCPServer("loopback")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text back."""
        return f"echo: {text}"

    @server.tool()
    def fail(reason: str) -> str:
        """Always fails."""
        raise ValueError(f"failed on purpose: {reason}")

    @server.tool()
    def garble() -> str:
        """Fails with a NUL character in its error (not storable in Postgres as is)."""
        raise ToolError("garbled \x00 answer")

    @server.tool()
    async def wait(seconds: float) -> str:
        """Sleep, then say so."""
        WAITING.set()
        await anyio.sleep(seconds)
        return "waited"

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add the tool `shout` and announce the change."""

        def shout(text: str) -> str:
            """Shout the text."""
            return text.upper()

        server.add_tool(shout)
        await ctx.session.send_tool_list_changed()
        return "grown"

    return server


@contextmanager
def serving() -> Iterator[tuple[int, Recorder]]:
    """The server on a free loopback port until the block ends: (port, recorder)."""
    port = _free_port()
    recorder = Recorder(build().streamable_http_app())
    config = uvicorn.Config(
        recorder, host="127.0.0.1", port=port, log_level="warning", lifespan="on", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="mcp-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:  # uvicorn's own flag: bound and accepting
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test MCP server did not start")
        time.sleep(0.02)
    try:
        yield port, recorder
    finally:
        server.should_exit = server.force_exit = True  # workers may still hold a session stream open
        thread.join(timeout=10)
