"""The two handler shapes every served RPC takes (unary, server-streaming): authenticate as
the mirrored HTTP route, run the body with the principal, and turn whatever it raises into a
status: an ApplicationError as apps.grpcapi.errors maps it, a body the route's schema refuses
as INVALID_ARGUMENT, anything else INTERNAL with nothing of it on the wire (logged here). A
failure ends the call with its status; the server and its other streams go on."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from pydantic import BaseModel

from apps.core.errors import ApplicationError, Invalid
from apps.core.http import check_storable, validated_body
from apps.core.ids import is_ident
from apps.core.types import Principal
from apps.grpcapi.auth import principal_for
from apps.grpcapi.errors import Refusal, refusal

log = logging.getLogger("loomcycle.grpc")

M = TypeVar("M", bound=BaseModel)
Route = tuple[str, str]  # the HTTP (method, path) whose scope the RPC takes
RouteFor = Route | Callable[[Any], Route]  # fixed, or chosen from the request (an op-dispatch's op)
UnaryBody = Callable[[Any, Any, Principal], Awaitable[Any]]
StreamBody = Callable[[Any, Any, Principal], AsyncIterator[Any]]
INTERNAL = Refusal(grpc.StatusCode.INTERNAL, "internal error", "internal", {})


def parsed(schema: type[M], body: dict[str, Any]) -> M:
    """The body an RPC's request became (apps.grpcapi.convert) through the HTTP route's schema."""
    check_storable(body)
    return validated_body(schema, body)


def ident(value: str, what: str) -> str:
    """An id field (run_id, agent_id, session_id, ...) as the HTTP path checks one."""
    if not is_ident(value):
        raise Invalid(f"invalid {what}: must match [A-Za-z0-9_-]{{1,128}}", code="invalid_request")
    return value


def only_fields(request: Any, served: set[str], rpc: str) -> None:
    """A field this runtime does not act on for `rpc` is refused by name, never dropped."""
    extra = sorted(f.name for f, _ in request.ListFields() if f.name not in served)
    if extra:
        raise Invalid(f"{rpc}: not supported by this runtime: {', '.join(extra)}", code="unsupported_field")


def _failure(exc: Exception, method: str) -> Refusal:
    if isinstance(exc, ApplicationError):
        return refusal(exc)
    log.exception("grpc %s failed", method)
    return INTERNAL


async def _abort(context: grpc.aio.ServicerContext, failure: Refusal) -> None:
    await context.abort(failure.code, failure.message, trailing_metadata=failure.trailer())


def _route(route: RouteFor, request: Any) -> Route:
    return route(request) if callable(route) else route


def unary(route: RouteFor) -> Callable[[UnaryBody], Callable[..., Awaitable[Any]]]:
    def wrap(body: UnaryBody) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(body)
        async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                principal = await principal_for(context, *_route(route, request))
                return await body(self, request, principal)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a status (module docstring)
                failure = _failure(exc, body.__name__)
            await _abort(context, failure)

        return handler

    return wrap


def streaming(route: Route) -> Callable[[StreamBody], Callable[..., AsyncIterator[Any]]]:
    def wrap(body: StreamBody) -> Callable[..., AsyncIterator[Any]]:
        @functools.wraps(body)
        async def handler(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                principal = await principal_for(context, *route)
                async for message in body(self, request, principal):
                    yield message
                return
            except Exception as exc:  # noqa: BLE001 - every failure becomes a status (module docstring)
                failure = _failure(exc, body.__name__)
            await _abort(context, failure)

        return handler

    return wrap
