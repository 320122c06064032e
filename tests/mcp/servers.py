"""A streamable-HTTP MCP server for the tests, built with the official SDK
(`MCPServer`) and served by uvicorn on a loopback port in a thread of the test
process. It records the headers, JSON-RPC method, session id and status of every request
it gets, and can forget its sessions as the SDK's server does when one expires (`expire`);
`garble` fails with a NUL in its error; its
`grow` tool adds a tool and tells the caller its list changed; `wait` sets `WAITING`
and sleeps (the cancel test). `hostile_serving` puts the same server behind `Hostile`,
which answers one method with a gzip bomb, an oversized reply or pages without end."""

from __future__ import annotations

import json
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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


@dataclass
class Seen:
    """One HTTP request the server got: its JSON-RPC method (or the HTTP method when the
    body is not one JSON-RPC message), its Mcp-Session-Id ("" without one), its headers
    (lower-case names) and the status it was answered with."""

    method: str
    session: str
    headers: dict[str, str]
    status: int = 0


class Recorder:
    """ASGI middleware keeping (Host, Authorization) of each HTTP request, and each
    request as `Seen`. `expire` makes the SDK's session manager forget every open session
    before the next request that names one (`always`: before every such request), so
    that request gets the SDK's own 404 "Session not found", as an expired session does."""

    def __init__(self, app: Any, server: MCPServer) -> None:
        self.app, self.server = app, server
        self.seen: list[tuple[str, str]] = []
        self.requests: list[Seen] = []
        self.expiring: str = ""  # "", "next" or "always"

    def expire(self, *, always: bool = False) -> None:
        self.expiring = "always" if always else "next"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers") or []}
        self.seen.append((headers.get("host", ""), headers.get("authorization", "")))
        seen = Seen(method=scope["method"], session=headers.get("mcp-session-id", ""), headers=headers)
        self.requests.append(seen)
        if seen.session and self.expiring:
            self.expiring = "" if self.expiring == "next" else self.expiring
            await self._forget_sessions()
        body = bytearray()

        async def receiving() -> Any:
            message = await receive()
            body.extend(message.get("body", b""))
            if not message.get("more_body"):
                seen.method = _rpc_method(bytes(body)) or seen.method
            return message

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                seen.status = message["status"]
            await send(message)

        await self.app(scope, receiving, sending)

    async def _forget_sessions(self) -> None:
        """What the SDK's manager does when a session's idle timeout ends it (its private API:
        the public one has no way to end a session from the server's side)."""
        manager = self.server.session_manager
        for session_id, transport in list(manager._server_instances.items()):
            await manager._discard_session(session_id, transport)

    def calls(self, method: str) -> list[Seen]:
        return [r for r in self.requests if r.method == method]

    def authorizations(self, host: str) -> set[str]:
        """The Authorization values of the requests addressed to `host` (any port)."""
        return {auth for seen_host, auth in self.seen if seen_host.rsplit(":", 1)[0] == host}


def _rpc_method(body: bytes) -> str:
    try:
        message = json.loads(body)
    except ValueError:
        return ""
    return str(message.get("method", "")) if isinstance(message, dict) else ""


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
def _serve(app: Any) -> Iterator[int]:
    """`app` on a free loopback port until the block ends."""
    port = _free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", timeout_graceful_shutdown=1
    )
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, name="mcp-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not served.started:  # uvicorn's own flag: bound and accepting
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test MCP server did not start")
        time.sleep(0.02)
    try:
        yield port
    finally:
        served.should_exit = served.force_exit = True  # workers may still hold a session stream open
        thread.join(timeout=10)


@contextmanager
def serving() -> Iterator[tuple[int, Recorder]]:
    """The server on a free loopback port until the block ends: (port, recorder)."""
    server = build()
    recorder = Recorder(server.streamable_http_app(), server)
    with _serve(recorder) as port:
        yield port, recorder


def gzip_bomb(inflated: int) -> bytes:
    """`inflated` zero bytes, gzip-compressed (about a thousandth of the size)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # 16+: the gzip wrapper
    block = bytes(1024 * 1024)
    return b"".join(packer.compress(block) for _ in range(inflated // len(block))) + packer.flush()


class Hostile:
    """ASGI middleware making the server hostile for one JSON-RPC method (`method`): with
    `mode` set, that request is answered with, instead of the server's reply,
    - "gzip": a gzip bomb (`bomb`) labelled `Content-Encoding: gzip`, JSON;
    - "huge": a well-formed JSON-RPC result padded to `size` bytes, uncompressed;
    - "huge-sse": the same as one event of a `text/event-stream` reply;
    - "slow": the server's own reply, `delay` seconds late;
    - "paging": a tools/list page of `size` tools with a next cursor, every time (it never ends).
    Every other request goes to the server as usual (so `initialize` succeeds)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.mode, self.method, self.size, self.bomb, self.delay = "", "tools/list", 0, b"", 0.0
        self.answered: list[str] = []  # the modes it answered with
        self.encodings: list[str] = []  # the Accept-Encoding of every HTTP request ("" without one)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            self.encodings.append(headers.get(b"accept-encoding", b"").decode())
        if scope["type"] != "http" or not self.mode:
            await self.app(scope, receive, send)
            return
        messages, body = [], bytearray()
        while True:
            message = await receive()
            messages.append(message)
            body.extend(message.get("body", b""))
            if not message.get("more_body"):
                break
        if _rpc_method(bytes(body)) != self.method:
            await self.app(scope, _replaying(messages, receive), send)
            return
        self.answered.append(self.mode)
        if self.mode == "slow":  # the server's own answer, `delay` seconds late
            await anyio.sleep(self.delay)
            await self.app(scope, _replaying(messages, receive), send)
            return
        await self._answer(json.loads(body).get("id"), send)

    async def _answer(self, request_id: Any, send: Any) -> None:
        result: dict[str, Any] = {"tools": [], "_meta": {"pad": "x" * self.size}}
        if self.mode == "paging":
            page = len(self.answered) - 1  # this page (its answer is recorded already)
            tools = [{"name": f"p{page}_{i}", "inputSchema": {"type": "object"}} for i in range(self.size)]
            result = {"tools": tools, "nextCursor": f"page-{page + 1}"}
        reply = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
        kind, chunks = b"application/json", [reply.encode()]
        headers = [(b"content-type", kind)]
        if self.mode == "gzip":
            headers.append((b"content-encoding", b"gzip"))
            chunks = [self.bomb[i : i + 65536] for i in range(0, len(self.bomb), 65536)]
        elif self.mode == "huge-sse":
            headers = [(b"content-type", b"text/event-stream")]
            chunks = [b"event: message\ndata: " + reply.encode() + b"\n\n"]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def _replaying(messages: list[dict[str, Any]], receive: Any) -> Any:
    pending = list(messages)

    async def replay() -> Any:
        return pending.pop(0) if pending else await receive()

    return replay


@contextmanager
def hostile_serving() -> Iterator[tuple[int, Hostile]]:
    """The server behind `Hostile`, on a free loopback port: (port, hostile)."""
    server = build()
    hostile = Hostile(server.streamable_http_app())
    with _serve(hostile) as port:
        yield port, hostile
