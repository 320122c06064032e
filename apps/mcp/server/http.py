"""`/v1/_mcp`: the SDK's Streamable HTTP transport, mounted ahead of Django in
loomcycle_project/asgi.py, behind the REST API's bearer auth and scope gate.

Order per request: bearer -> principal and the route's scope
(`apps.substrate.auth.aauthenticate_for`, as every REST route); a refusal
(401 missing/wrong bearer, 403 scope or open mode off loopback, 503
`auth_unavailable` when the token store is down or authentication fails
unexpectedly) is answered here, before the SDK reads anything. The principal
then rides in the ASGI scope (`PRINCIPAL_KEY`) to the tool handlers.

Django's middleware does not run here, so its two checks on the Host are made
here too: ALLOWED_HOSTS (400 `disallowed_host`), and in open mode the
DNS-rebinding and cross-site refusals of apps.substrate.openmode (400
`open_mode_host`, 403 `cross_site_request`).

What this gives up, said plainly:
- Stateless mode (`stateless=True`, JSON responses): each POST is served on
  its own, so any web replica answers any request (no sticky sessions, no
  per-session memory). The cost: no server-to-client requests (sampling,
  elicitation) and no GET notification stream; none of our tools needs them.
- Daphne runs no ASGI lifespan, so the session manager's task group (which
  the SDK needs even when stateless) is started lazily by the first request
  in a task of its own that lives as long as the process's event loop; if that
  task ends, the next request starts a new manager.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from apps.core.errors import ApplicationError
from apps.core.types import Principal
from apps.mcp.server.server import Ctx, build_server
from apps.substrate.auth import AuthUnavailable, aauthenticate_for, bearer_from_headers
from apps.substrate.openmode import host_refusal

log = logging.getLogger("loomcycle.mcp.server")

PATH = "/v1/_mcp"
PRINCIPAL_KEY = "loomcycle.principal"
MAX_BODY_BYTES = 16 * 1024 * 1024  # as a run's body (LOOMCYCLE_MAX_REQUEST_BYTES' default)


def is_mcp_path(path: str) -> bool:
    return path == PATH or path == PATH + "/"


def principal_of(ctx: Ctx) -> Principal:
    """The principal `McpHttpApp` authenticated for this request."""
    if ctx.request is None or PRINCIPAL_KEY not in ctx.request.scope:
        raise RuntimeError("an MCP request reached a handler without an authenticated principal")
    principal: Principal = ctx.request.scope[PRINCIPAL_KEY]
    return principal


class _Manager:
    """The session manager and the task that holds its `run()` context open. If that task
    ends (its task group failed), the next request starts a new manager (the SDK's `run()`
    is once per instance) instead of every later request failing."""

    def __init__(self) -> None:
        self._ready: asyncio.Future[StreamableHTTPSessionManager] | None = None
        self._task: asyncio.Task[None] | None = None

    async def started(self) -> StreamableHTTPSessionManager:
        """The manager, its task group running (started on first use, on this event loop)."""
        if self._ready is None:
            loop = asyncio.get_running_loop()
            manager = StreamableHTTPSessionManager(
                build_server(principal_of), json_response=True, stateless=True, max_request_body_size=MAX_BODY_BYTES
            )
            self._ready = ready = loop.create_future()
            self._task = loop.create_task(self._hold(manager, ready))
        return await asyncio.shield(self._ready)

    async def _hold(
        self, manager: StreamableHTTPSessionManager, ready: asyncio.Future[StreamableHTTPSessionManager]
    ) -> None:
        try:
            async with manager.run():
                ready.set_result(manager)
                await asyncio.Event().wait()  # for the event loop's life
        except Exception as exc:  # logged; the next request starts a new manager (finally)
            if not ready.done():
                ready.set_exception(RuntimeError(f"the MCP session manager did not start: {exc!r}"))
            log.error("MCP session manager stopped; the next request starts a new one", exc_info=exc)
        finally:
            if not ready.done():  # cancelled while starting
                ready.set_exception(RuntimeError("the MCP session manager was stopped while starting"))
            if self._ready is ready:
                self._ready, self._task = None, None


async def _refuse(send: Any, exc: ApplicationError) -> None:
    body = json.dumps(exc.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _principal(scope: dict[str, Any], headers: dict[str, str]) -> Principal:
    """The caller, authorised for `/v1/_mcp`, and the Host checks passed; raises the refusal."""
    refusal = host_refusal(headers, None)
    if refusal is not None:
        raise refusal
    client = scope.get("client")
    addr = client[0] if client else None
    principal = await aauthenticate_for(bearer_from_headers(headers), addr, scope.get("method", "POST"), PATH)
    refusal = host_refusal(headers, principal)
    if refusal is not None:
        raise refusal
    return principal


class McpHttpApp:
    """ASGI app for `/v1/_mcp`: authenticate, then hand the request to the SDK."""

    def __init__(self) -> None:
        self._manager = _Manager()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            principal = await _principal(scope, headers)
        except ApplicationError as exc:
            await _refuse(send, exc)
            return
        except Exception:  # an unexpected failure of authentication: fail closed, said as a 503
            log.exception("/v1/_mcp: authenticating the request failed")
            await _refuse(send, AuthUnavailable("authentication is unavailable; try again later"))
            return
        manager = await self._manager.started()
        await manager.handle_request({**scope, PRINCIPAL_KEY: principal}, receive, send)
