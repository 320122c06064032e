"""Open MCP sessions, owned by one event loop per process (see `calls` for the thread).

Invariants:
- every session is opened and closed by its own owner task (`_own`), because the
  SDK's transports are anyio context managers that must exit in the task that
  entered them; other tasks only send requests on it;
- a stdio server is one process per (process, def version), started on first use;
  at most `max_stdio` are open (the least recently used idle one is stopped to make
  room; when all are busy the call is refused); HTTP sessions are bounded likewise;
- opening a session (connect/spawn and `initialize`) is bounded by the call timeout:
  a server that never finishes `initialize` fails the open, and its process is
  stopped; a caller that gives up while the session is still opening drops it
  (its owner task is cancelled), so the next call starts a fresh one;
- a session whose server died or whose HTTP session expired is dropped; the call
  that found it so is sent once more on a fresh session (so a call the server was
  running when it died may run twice: said in docs/mcp.md);
- a `notifications/tools/list_changed` never re-lists on an HTTP session (it may
  carry one run's credentials, and the cache is shared): `on_tools(spec, None)`
  asks for a credential-less re-discovery instead; a stdio session (no run
  credentials) re-lists on itself and hands the tools over. At most one per
  server is under way. `on_tools` runs on a thread (it writes the cache through Django);
- an HTTP session idle for `IDLE_HTTP_TTL_S` is closed (its headers may hold a
  finished run's credentials).
Nothing here touches Django or the database.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from functools import partial
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp.client._transport import TransportStreams
from mcp.client.session import ClientSession, IncomingMessage, MessageHandlerFnT
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from apps.mcp.client.servers import ServerSpec
from apps.mcp.client.transport import guarded_client

log = logging.getLogger("loomcycle.mcp")

MAX_HTTP_SESSIONS = 64
MAX_TOOLS = 256  # tools kept of one server's list (list_all reads no further)
# tools/list pages read at most: held in memory together, each up to the reply cap, so this
# bounds what one discovery holds (16 x LOOMCYCLE_MCP_MAX_RESPONSE_BYTES)
MAX_LIST_PAGES = 16
IDLE_HTTP_TTL_S = 300.0
ToolsListener = Callable[[ServerSpec, list[dict[str, Any]] | None], None]
GONE_ERRORS = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, httpx2.TransportError)


class McpOpenFailed(Exception):
    """A session could not be opened (the server did not finish `initialize` in time, or went away)."""


class McpListTooLong(Exception):
    """A server still paging tools/list after MAX_LIST_PAGES pages (it may never stop)."""


class McpBusy(Exception):
    """Every session of the kind asked for that this process may keep is busy with a call."""


def gone(exc: BaseException) -> bool:
    """Whether `exc` says the session is unusable (server died, session expired or closed).
    An expired session is an INVALID_REQUEST error naming the session: the SDK server's 404
    "Session not found", or the SDK client's "Session terminated" for a bare 404. Any other
    error is the call's own, even one whose text says "session": re-sending it would run a
    tool twice."""
    if isinstance(exc, MCPError):
        expired = exc.code == types.INVALID_REQUEST and "session" in exc.message.lower()
        return exc.code == types.CONNECTION_CLOSED or expired
    return isinstance(exc, GONE_ERRORS)


def tool_dicts(result: types.ListToolsResult) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "description": t.description or "", "input_schema": dict(t.input_schema or {})}
        for t in result.tools
    ]


async def list_all(session: ClientSession) -> list[dict[str, Any]]:
    """The pages of tools/list until MAX_TOOLS tools are read (the first listed are the ones
    kept: reading stops there, the cursor is not followed further). Each page is bounded in
    bytes by the transport; the pages are bounded in number too, as a server may hand out a
    next cursor forever: one still paging after MAX_LIST_PAGES fails (McpListTooLong)."""
    page = await session.list_tools()
    out, pages = tool_dicts(page), 1
    while page.next_cursor and len(out) < MAX_TOOLS:
        if pages == MAX_LIST_PAGES:
            raise McpListTooLong(
                f"the MCP server was still paging tools/list after {MAX_LIST_PAGES} pages "
                f"({len(out)} tools); at most {MAX_LIST_PAGES} pages are read"
            )
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=page.next_cursor))
        out, pages = out + tool_dicts(page), pages + 1
    return out


@asynccontextmanager
async def _streams(spec: ServerSpec, timeout: float) -> AsyncIterator[TransportStreams]:
    if spec.is_stdio:
        params = StdioServerParameters(command=spec.command, args=list(spec.args), env=dict(spec.env) or None)
        async with stdio_client(params) as streams:
            yield streams
        return
    assert spec.policy is not None
    max_bytes = spec.max_response_bytes
    async with guarded_client(spec.policy, dict(spec.headers), timeout, max_bytes) as client:
        async with streamable_http_client(spec.url, http_client=client, max_sse_event_size=max_bytes) as streams:
            yield streams


def open_session(
    spec: ServerSpec, timeout: float, handler: MessageHandlerFnT | None = None
) -> AbstractAsyncContextManager[ClientSession]:
    """A one-off initialised session (discovery), closed on exit."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[ClientSession]:
        async with AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(_streams(spec, timeout))
            session = await stack.enter_async_context(ClientSession(read, write, message_handler=handler))
            await session.initialize()
            yield session

    return opened()


class _Live:
    """One open session and the task that owns it."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.session: ClientSession | None = None
        self.stop = asyncio.Event()
        self.ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self.busy = 0
        self.used_at = asyncio.get_running_loop().time()
        self.dead = False
        self.task: asyncio.Task[None] | None = None


class Sessions:
    """The process's open sessions. Used only from the loop's thread (no locks)."""

    def __init__(self, *, max_stdio: int, timeout: float, on_tools: ToolsListener) -> None:
        self._max_stdio, self._timeout, self._on_tools = max_stdio, timeout, on_tools
        self._live: OrderedDict[str, _Live] = OrderedDict()
        self._refreshes: set[asyncio.Task[None]] = set()  # referenced until done (asyncio keeps weak refs)
        self._relisting: set[str] = set()  # def ids with a re-list under way
        self._reaper: asyncio.TimerHandle | None = None

    async def call(self, spec: ServerSpec, tool: str, args: dict[str, Any]) -> types.CallToolResult:
        """Call `tool`; a session found gone is replaced and the call sent once more."""
        for attempt in (1, 2):
            live = self._reserve(spec)
            try:
                session = await self._ready(live)
                return await session.call_tool(tool, args)
            except Exception as exc:
                if not gone(exc) or attempt == 2:
                    raise
                log.warning("mcp server %r: session gone (%s); reconnecting once", spec.name, exc)
                self._drop(live)
            finally:
                live.busy -= 1
                live.used_at = asyncio.get_running_loop().time()
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _ready(self, live: _Live) -> ClientSession:
        """The session once open; a caller cancelled (its deadline) while it is still
        opening drops it, so a server that never answers `initialize` is not kept."""
        try:
            return await asyncio.shield(live.ready)
        except asyncio.CancelledError:
            if not live.ready.done():
                self._drop(live)
            raise

    def _reserve(self, spec: ServerSpec) -> _Live:
        """The live session for `spec` (opening one if needed), counted busy until released;
        a busy session is never stopped to make room, even while it is still opening."""
        live = self._live.get(spec.key)
        if live is not None and live.dead:
            self._drop(live)
            live = None
        if live is None:
            self._make_room(spec)
            live = _Live(spec)
            self._live[spec.key] = live
            live.task = asyncio.create_task(self._own(live), name=f"mcp:{spec.name}")
        self._live.move_to_end(spec.key)
        live.busy += 1
        if not spec.is_stdio and self._reaper is None:
            self._reaper = asyncio.get_running_loop().call_later(IDLE_HTTP_TTL_S, self._reap_idle)
        return live

    def _reap_idle(self) -> None:
        """Close HTTP sessions idle for IDLE_HTTP_TTL_S; again later while any is open."""
        self._reaper = None
        now = asyncio.get_running_loop().time()
        http = [v for v in self._live.values() if not v.spec.is_stdio]
        for live in http:
            if live.busy == 0 and now - live.used_at >= IDLE_HTTP_TTL_S:
                self._drop(live)
        if any(not v.spec.is_stdio for v in self._live.values()):
            self._reaper = asyncio.get_running_loop().call_later(IDLE_HTTP_TTL_S, self._reap_idle)

    def _make_room(self, spec: ServerSpec) -> None:
        same = [v for v in self._live.values() if v.spec.is_stdio == spec.is_stdio]
        limit = self._max_stdio if spec.is_stdio else MAX_HTTP_SESSIONS
        if len(same) < limit:
            return
        idle = next((v for v in same if v.busy == 0), None)  # least recently used first
        if idle is None:
            what = "stdio server processes" if spec.is_stdio else "HTTP sessions"
            raise McpBusy(f"all {limit} MCP {what} of this process are busy; try again later")
        self._drop(idle)

    def _drop(self, live: _Live) -> None:
        """Forget `live` and stop it: an open session is closed by its owner; one still
        opening has its owner task cancelled (which stops a stdio server it spawned)."""
        live.dead = True
        live.stop.set()
        if live.task is not None and not live.ready.done() and live.task is not asyncio.current_task():
            live.task.cancel()
        if self._live.get(live.spec.key) is live:
            del self._live[live.spec.key]

    async def _own(self, live: _Live) -> None:
        handler: MessageHandlerFnT = partial(self._on_message, live)
        try:
            with anyio.fail_after(self._timeout) as opening:  # spawn/connect and initialize
                async with open_session(live.spec, self._timeout, handler) as session:
                    opening.deadline = math.inf  # open: it lives until stopped
                    live.session = session
                    live.ready.set_result(session)
                    await live.stop.wait()
        except TimeoutError:
            if live.ready.done():
                log.warning("mcp server %r: session ended", live.spec.name, exc_info=True)
                return
            why = f"the server did not finish initialize within {self._timeout:g} s"
            log.warning("mcp server %r: %s; stopped", live.spec.name, why)
            live.ready.set_exception(McpOpenFailed(why))
            live.ready.exception()  # retrieved: a caller that gave up first does not leave it unread
        except Exception as exc:  # the opener's error, or (logged) how an open session ended
            if not live.ready.done():
                live.ready.set_exception(exc)
                live.ready.exception()
            else:
                log.warning("mcp server %r: session ended", live.spec.name, exc_info=True)
        finally:
            if not live.ready.done():  # cancelled while opening (a caller gave up, or shutdown)
                live.ready.set_exception(McpOpenFailed("the session was stopped before it was open"))
                live.ready.exception()
            self._drop(live)

    async def _on_message(self, live: _Live, message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            if live.spec.def_id in self._relisting:
                return  # one re-list per server at a time; it reads the list as it is by then
            self._relisting.add(live.spec.def_id)
            task = asyncio.create_task(self._refresh(live), name=f"mcp-list:{live.spec.name}")
            self._refreshes.add(task)
            task.add_done_callback(self._refreshes.discard)
        elif isinstance(message, Exception):
            log.warning("mcp server %r: transport error: %r", live.spec.name, message)

    async def _refresh(self, live: _Live) -> None:
        """A stdio session re-lists on itself; an HTTP one asks for a credential-less discovery."""
        try:
            tools = None
            if live.spec.is_stdio:
                assert live.session is not None
                tools = await list_all(live.session)
            await asyncio.to_thread(self._on_tools, live.spec, tools)
        except Exception:  # logged: the cache keeps the previous list; the next list_changed retries
            log.exception("mcp server %r: re-listing tools after list_changed failed", live.spec.name)
        finally:
            self._relisting.discard(live.spec.def_id)

    async def close_all(self) -> None:
        """Stop every session (their owner tasks close them: a stdio server is shut down)."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        lives = list(self._live.values())
        for live in lives:
            self._drop(live)
        tasks = [t for t in (live.task for live in lives) if t is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=10)
