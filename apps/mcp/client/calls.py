"""The synchronous face of the MCP client, for the engine's tool threads, discovery
and on_complete hooks.

One daemon thread per process runs an asyncio loop that owns every session
(`sessions.Sessions`); it is started on first use and again in a forked child
(a fork does not copy threads). A caller submits a coroutine and waits on its
future, bounded: the coroutine runs under `anyio.fail_after(timeout)`, and the
wait gives up a little later still. The caller holds no DB connection while it
waits (the tool adapter closes it first) and never the engine's admission slot
(tool calls run outside it, apps.runs.engine). `shutdown()` stops every session
(stdio server processes included); a worker calls it when it shuts down (its handler is
connected from McpConfig.ready(), `connect_worker_shutdown`) and atexit covers other processes.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import httpx2
import mcp_types as types
from celery.signals import worker_process_shutdown, worker_shutdown
from django.conf import settings
from mcp.shared.exceptions import MCPError

from apps.core.egress import EgressRefused
from apps.mcp.client.servers import ServerSpec, check_reachable
from apps.mcp.client.sessions import (
    GONE_ERRORS,
    McpBusy,
    McpListTooLong,
    McpOpenFailed,
    Sessions,
    ToolsListener,
    list_all,
    open_session,
)
from apps.mcp.client.transport import ReplyRefused

log = logging.getLogger("loomcycle.mcp")

T = TypeVar("T")
_GRACE_S = 5.0  # the wait outlives the coroutine's own deadline by this much
MAX_RESULT_CHARS = 256 * 1024
MAX_DISCOVERIES = 8  # one-off discovery sessions a process runs at once; more wait (bounded) for a turn


class McpCallFailed(Exception):
    """A call or discovery that did not get an answer; the message is for the model or operator."""


class McpCancelled(McpCallFailed):
    """The caller's cancel event was set while the call was running."""


class _Runner:
    def __init__(self, on_tools: ToolsListener) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        conf = settings.LOOMCYCLE
        self.sessions = Sessions(
            max_stdio=conf.mcp_max_stdio_processes, timeout=conf.mcp_call_timeout_seconds, on_tools=on_tools
        )
        # Taken on the loop, so a discovery waiting for its turn holds no thread (asyncio's
        # Semaphore binds to the loop that first awaits it: only this one ever does).
        self.discoveries = asyncio.Semaphore(MAX_DISCOVERIES)
        self.thread = threading.Thread(target=self.loop.run_forever, name="lc-mcp", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float, cancel: threading.Event | None = None) -> T:
        """The coroutine's result; `cancel` set first cancels it (McpCancelled)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        if cancel is not None:  # a watchdog thread, as Bash's, woken by the run's cancel event
            threading.Thread(target=_cancel_on, args=(future, cancel), name="lc-mcp-cancel", daemon=True).start()
        try:
            return future.result(timeout + _GRACE_S)
        except concurrent.futures.CancelledError as exc:
            raise McpCancelled("cancelled with the run") from exc
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:g} s") from exc


def _cancel_on(future: concurrent.futures.Future[Any], cancel: threading.Event) -> None:
    """Cancel the call's task as soon as `cancel` is set; end within a second of the call's end."""
    while not future.done():
        if cancel.wait(1.0):
            future.cancel()  # cancels the coroutine's task on the loop (the SDK tells the server)
            return


_LOCK = threading.Lock()
_RUNNER: list[_Runner] = []
_TOOLS_LISTENER: list[ToolsListener] = []


def set_tools_listener(listener: ToolsListener) -> None:
    """Who stores a re-listed tool list (apps.mcp.services, at ready())."""
    _TOOLS_LISTENER[:] = [listener]


def _on_tools(spec: ServerSpec, tools: list[dict[str, Any]] | None) -> None:
    for listener in _TOOLS_LISTENER:
        listener(spec, tools)


def _runner() -> _Runner:
    with _LOCK:
        if not _RUNNER or _RUNNER[0].pid != os.getpid():
            _RUNNER[:] = [_Runner(_on_tools)]
        return _RUNNER[0]


def shutdown(timeout: float = 15.0) -> None:
    """Close every session of this process (idempotent; nothing to do if none was opened)."""
    with _LOCK:
        runner = _RUNNER[0] if _RUNNER and _RUNNER[0].pid == os.getpid() else None
        _RUNNER.clear()
    if runner is None:
        return
    try:
        runner.run(runner.sessions.close_all(), timeout)
    except TimeoutError:
        log.warning("MCP sessions did not all close within %s s", timeout)
    runner.loop.call_soon_threadsafe(runner.loop.stop)


atexit.register(shutdown)


def connect_worker_shutdown() -> None:
    """Stop a worker's sessions when it (or a prefork child) shuts down: its stdio servers exit
    with it, not after it. Idempotent: ready() may run more than once in a process."""
    worker_shutdown.connect(_on_worker_shutdown, weak=False, dispatch_uid="mcp.worker_shutdown")
    worker_process_shutdown.connect(_on_worker_shutdown, weak=False, dispatch_uid="mcp.worker_process_shutdown")


def _on_worker_shutdown(sender: Any = None, **_: Any) -> None:
    shutdown()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_reason(e) for e in exc.exceptions)
    return str(exc) or type(exc).__name__


def call_tool(
    spec: ServerSpec, tool: str, args: dict[str, Any], cancel: threading.Event | None = None
) -> types.CallToolResult:
    """Call one tool on a (pooled) session; raises McpCallFailed with the reason
    (McpCancelled when `cancel` is set first)."""
    timeout = settings.LOOMCYCLE.mcp_call_timeout_seconds
    runner = _runner()

    async def bounded() -> types.CallToolResult:
        with anyio.fail_after(timeout):
            return await runner.sessions.call(spec, tool, args)

    try:
        check_reachable(spec)
        return runner.run(bounded(), timeout, cancel)
    except McpCallFailed:
        raise
    except TimeoutError as exc:
        raise McpCallFailed(f"no answer within {timeout:g} s (LOOMCYCLE_MCP_CALL_TIMEOUT_SECONDS)") from exc
    except Exception as exc:  # the server's or the transport's error, the model's is_error result
        raise McpCallFailed(_reason(exc)) from exc


async def _listed(runner: _Runner, spec: ServerSpec, timeout: float) -> list[dict[str, Any]]:
    """tools/list on a one-off session, on the MCP loop; the wait for a turn, the guard's
    name resolution and the session all within `timeout`."""
    with anyio.fail_after(timeout):
        async with runner.discoveries:
            await anyio.to_thread.run_sync(check_reachable, spec)  # getaddrinfo blocks: the loop's own pool
            async with open_session(spec, timeout) as session:
                return await list_all(session)


# What a server, the network, the SSRF guard or the SDK's handling of the protocol can end a
# discovery with (the SDK's task groups may wrap them in an ExceptionGroup): stored with the
# cache row as the discovery's failure. Anything else is a bug here and propagates.
DISCOVERY_ERRORS: tuple[type[Exception], ...] = (
    TimeoutError,
    OSError,  # a stdio command that cannot start, a socket error the transport did not map
    EgressRefused,
    httpx2.HTTPError,  # transport errors, HTTP status errors, an event stream refused
    ReplyRefused,
    MCPError,
    McpCallFailed,
    McpOpenFailed,
    McpBusy,
    McpListTooLong,
    *GONE_ERRORS,
)
_CAUGHT: tuple[type[Exception], ...] = (*DISCOVERY_ERRORS, ExceptionGroup)


def list_tools(spec: ServerSpec) -> list[dict[str, Any]]:
    """tools/list on a one-off session (discovery); raises McpCallFailed with the reason.
    At most MAX_DISCOVERIES run at once per process; another waits for a turn within the
    discovery timeout."""
    timeout = settings.LOOMCYCLE.mcp_discovery_timeout_seconds
    runner = _runner()
    try:
        return runner.run(_listed(runner, spec, timeout), timeout)
    except _CAUGHT as exc:  # reported to the operator and stored with the cache row
        raise _discovery_failed(exc, timeout) from exc


async def alist_tools(spec: ServerSpec) -> list[dict[str, Any]]:
    """list_tools for an event loop (the web process's): the caller awaits the MCP loop's
    future, so the wait holds no thread of the caller's loop. Fails as list_tools does."""
    timeout = settings.LOOMCYCLE.mcp_discovery_timeout_seconds
    runner = _runner()
    future = asyncio.run_coroutine_threadsafe(_listed(runner, spec, timeout), runner.loop)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout + _GRACE_S)
    except _CAUGHT as exc:
        raise _discovery_failed(exc, timeout) from exc


def _discovery_failed(exc: Exception, timeout: float) -> McpCallFailed:
    """The McpCallFailed a discovery's DISCOVERY_ERRORS become; a group holding anything
    else is raised again (a bug is not a server's failure)."""
    if isinstance(exc, ExceptionGroup) and exc.split(DISCOVERY_ERRORS)[1] is not None:
        raise exc
    if isinstance(exc, TimeoutError):
        return McpCallFailed(f"no answer within {timeout:g} s (LOOMCYCLE_MCP_DISCOVERY_TIMEOUT_SECONDS)")
    return McpCallFailed(_reason(exc))


def result_text(result: types.CallToolResult) -> str:
    """What the model reads: the text blocks in order, other blocks named, the
    structured content when there is no text; capped at 256 KiB."""
    parts = [_block_text(block) for block in result.content]
    if not any(parts) and result.structured_content is not None:
        parts = [json.dumps(result.structured_content)]
    text = "\n".join(p for p in parts if p)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + "\n[truncated]"
    return text


def _block_text(block: Any) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        text = getattr(resource, "text", None)
        return text if isinstance(text, str) else f"[resource {resource.uri} ({resource.mime_type or 'binary'})]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link {block.uri}]"
    mime = getattr(block, "mime_type", "")
    return f"[{getattr(block, 'type', 'content')} {mime}]".replace(" ]", "]")
