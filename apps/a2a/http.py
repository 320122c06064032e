"""The A2A transport, mounted ahead of Django by loomcycle_project/asgi.py when
LOOMCYCLE_A2A_ENABLED=1: a Starlette router of the SDK's JSON-RPC dispatcher (its parsing,
v1.0 method names and the v0.3 ones such as `message/send`, SSE) over
apps.a2a.handler, and the agent cards, which are the SDK's AgentCard type serialised by
the SDK's helper.

Routes:
- GET  /.well-known/agent-card.json                     the runtime's card (every skill the caller reaches)
- GET  /a2a/agents/{skill}/.well-known/agent-card.json  one exposed agent's card
- POST /a2a/jsonrpc                                     JSON-RPC for every exposed skill (metadata.skillId)
- POST /a2a/agents/{skill}/jsonrpc                      JSON-RPC for that one agent

Order per request, as for /v1/_mcp: Host checks (apps.substrate.openmode.host_refusal), then
the bearer. A card answers without a token (then it lists the shared cards' skills only); a
JSON-RPC call needs one (401), and each method checks the scope of its REST twin in the
handler. Django's middleware does not run here.
"""

from __future__ import annotations

import logging
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from asgiref.sync import sync_to_async
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router

from apps.a2a import cards
from apps.a2a.handler import PRINCIPAL, SKILL, RunsRequestHandler
from apps.core.errors import ApplicationError, NotFound
from apps.core.types import Principal
from apps.substrate.auth import AuthUnavailable, aauthenticate_for, bearer_from_headers
from apps.substrate.openmode import host_refusal

log = logging.getLogger("loomcycle.a2a")

CARD_PATH = "/.well-known/agent-card.json"
PREFIX = "/a2a/"


def is_a2a_path(path: str) -> bool:
    return path == CARD_PATH or path.startswith(PREFIX)


def _refusal(exc: ApplicationError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


class _ContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's context, plus the caller this app authenticated and the endpoint's skill."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[PRINCIPAL] = request.scope[PRINCIPAL]
        context.state[SKILL] = request.path_params.get("skill")
        return context


def _base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


async def _exposed(request: Request) -> dict[str, cards.Exposed]:
    principal: Principal | None = request.scope.get(PRINCIPAL)
    tenant = principal.tenant_id if principal is not None else None
    return await sync_to_async(cards.exposed_for, thread_sensitive=False)(tenant)


async def runtime_card(request: Request) -> Response:
    card = cards.runtime_card(_base_url(request), await _exposed(request))
    return JSONResponse(agent_card_to_dict(card))


async def agent_card(request: Request) -> Response:
    skill = request.path_params["skill"]
    exposed = (await _exposed(request)).get(skill)
    if exposed is None:  # another tenant's skill answers as one that does not exist
        return _refusal(NotFound(f"no exposed agent with skill {skill!r}", code="not_found"))
    return JSONResponse(agent_card_to_dict(cards.agent_card(_base_url(request), exposed)))


def build_router() -> Router:
    dispatcher = JsonRpcDispatcher(
        request_handler=RunsRequestHandler(), context_builder=_ContextBuilder(), enable_v0_3_compat=True
    )
    return Router(
        routes=[
            Route(CARD_PATH, runtime_card, methods=["GET"]),
            Route(PREFIX + "agents/{skill}" + CARD_PATH, agent_card, methods=["GET"]),
            Route(PREFIX + "jsonrpc", dispatcher.handle_requests, methods=["POST"]),
            Route(PREFIX + "agents/{skill}/jsonrpc", dispatcher.handle_requests, methods=["POST"]),
        ]
    )


async def _principal(scope: dict[str, Any], headers: dict[str, str]) -> Principal | None:
    """The caller, or None for a card fetched without a token; raises the refusal."""
    refusal = host_refusal(headers, None)
    if refusal is not None:
        raise refusal
    token = bearer_from_headers(headers)
    if token is None and scope.get("method") == "GET":
        return None
    client = scope.get("client")
    # Any valid token passes here: each JSON-RPC method checks its REST twin's scope (apps.a2a.handler).
    principal = await aauthenticate_for(token, client[0] if client else None, "GET", CARD_PATH)
    refusal = host_refusal(headers, principal)
    if refusal is not None:
        raise refusal
    return principal


class A2AHttpApp:
    """ASGI app for the A2A paths: authenticate, then the router."""

    def __init__(self) -> None:
        self._router = build_router()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            principal = await _principal(scope, headers)
        except ApplicationError as exc:
            await _refusal(exc)(scope, receive, send)
            return
        except Exception:  # an unexpected failure of authentication: fail closed, said as a 503
            log.exception("A2A: authenticating the request failed")
            await _refusal(AuthUnavailable("authentication is unavailable; try again later"))(scope, receive, send)
            return
        await self._router({**scope, PRINCIPAL: principal}, receive, send)


__all__ = ["A2AHttpApp", "is_a2a_path"]
