"""Bearer -> principal, and the scope gate; used by every route and by the WebSocket consumers.

Resolution order (SPEC 2.0, 8):
1. an OperatorTokenDef, looked up by its peppered SHA-256 (indexed) and
   compared in constant time; past its `retired_at` it is a 401;
2. the legacy LOOMCYCLE_AUTH_TOKEN (constant time over SHA-256 digests), only
   while no admin-scoped token is valid: the first admin token retires it;
3. open mode, only with neither configured, only for loopback clients, and
   logged loudly once per process.
A database error fails closed (503), never into open mode. Then the route's
required scope (SPEC 2.1) is checked: 403 `insufficient_scope` with
`WWW-Authenticate: Bearer scope="<required>"`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import threading
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest
from django.utils import timezone

from apps.core.errors import ApplicationError, Forbidden, Unauthorized
from apps.core.scopes import ADMIN as ADMIN
from apps.core.scopes import ANY as ANY
from apps.core.scopes import CHANNEL_PUBLISH as CHANNEL_PUBLISH
from apps.core.scopes import CHANNEL_READ as CHANNEL_READ
from apps.core.scopes import RUNS_CREATE as RUNS_CREATE
from apps.core.scopes import RUNS_DELETE as RUNS_DELETE
from apps.core.scopes import RUNS_READ as RUNS_READ
from apps.core.scopes import TENANT as TENANT
from apps.core.scopes import has_scope as has_scope
from apps.core.scopes import isolated_scopes
from apps.core.types import Principal
from apps.substrate import auth_cache
from apps.substrate.openmode import credential_configured, open_mode_cached, remember_open_mode
from apps.substrate.tokens import live_admin_token_exists, token_by_hash, token_hash

log = logging.getLogger("loomcycle.auth")

MEMBER_SCOPES = frozenset({RUNS_CREATE, RUNS_READ, CHANNEL_PUBLISH, CHANNEL_READ})

OPEN_PRINCIPAL = Principal(tenant_id="", subject="open-mode", scopes=frozenset({ADMIN}), open_mode=True)
LEGACY_PRINCIPAL = Principal(tenant_id="", subject="legacy-token", scopes=frozenset({ADMIN}), legacy=True)

_OPEN_MODE_WARNED = threading.Event()


class AuthUnavailable(ApplicationError):
    status, code = 503, "auth_unavailable"


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def is_loopback(addr: str | None) -> bool:
    if not addr:
        return False
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def bearer_from_headers(headers: dict[str, str]) -> str | None:
    value = headers.get("authorization", "")
    if value[:7].lower() == "bearer ":
        return value[7:].strip()
    for proto in headers.get("sec-websocket-protocol", "").split(","):
        proto = proto.strip()
        if proto.startswith("bearer."):
            return proto[len("bearer.") :]
    return None


def _unauthorized() -> Unauthorized:
    # Opaque: unknown, expired and wrong tokens look the same (no oracle).
    return Unauthorized("unauthorized", headers={"WWW-Authenticate": "Bearer"})


def _token_principal(token: str) -> Principal | None:
    return principal_for_digest(token_hash(token))


def principal_for_digest(digest: str) -> Principal | None:
    """The principal of the live token whose stored hash is `digest` (cached as a
    bearer is); None for no such token, 401 past its `retired_at`. The console's
    session keeps this hash, never the token (apps.substrate.sessionauth)."""
    cached = auth_cache.lookup(digest)
    if cached is not None:
        return cached
    epoch = auth_cache.snapshot()
    row = token_by_hash(digest)
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        return None
    if row.retired_at is not None and row.retired_at <= timezone.now():
        raise _unauthorized()
    principal = Principal(tenant_id=row.tenant_id, subject=row.subject, scopes=frozenset(row.scopes))
    auth_cache.remember(digest, principal, row.retired_at, epoch)
    return principal


def _warn_open_mode() -> None:
    if not _OPEN_MODE_WARNED.is_set():
        _OPEN_MODE_WARNED.set()
        log.warning(
            "OPEN MODE: no LOOMCYCLE_AUTH_TOKEN and no admin operator token; every loopback client is "
            "an unauthenticated admin. Mint a token: `manage.py token create --name admin --tenant ops`."
        )


def authenticate(token: str | None, client_addr: str | None) -> Principal:
    """The principal for a bearer (None = no bearer). Raises 401, 403 (open mode
    off loopback) or 503 (token store unreachable)."""
    try:
        if token:
            principal = _token_principal(token)
            if principal is not None:
                return principal
        configured = settings.LOOMCYCLE.auth_token
        if configured:
            if token and hmac.compare_digest(_digest(token), _digest(configured)) and not live_admin_token_exists():
                return LEGACY_PRINCIPAL
            raise _unauthorized()
        cached = open_mode_cached()  # genuine answers only, kept 2 s
        if cached is None:
            cached = not credential_configured()  # DatabaseError -> 503 below: fail closed
            remember_open_mode(cached)
        if not cached or token:  # a bearer that is no token is a 401, never the open principal
            raise _unauthorized()
    except DatabaseError as exc:
        log.error("auth: token store lookup failed; refusing the request: %s", exc)
        raise AuthUnavailable("authentication is unavailable: the token store cannot be read") from exc
    if not is_loopback(client_addr):
        raise Forbidden("open mode (no token configured) serves loopback clients only", code="open_mode_loopback")
    _warn_open_mode()
    return OPEN_PRINCIPAL


# --- scopes (SPEC 2.1) ------------------------------------------------------------------


_TENANT_DEF_KINDS = (
    "agent skill team mcpserver schedule webhook memorybackend a2aagent a2aservercard documentsource volume credential"
).split()
_TENANT_DEF_PATHS = frozenset(
    [f"/v1/_{k}def" for k in _TENANT_DEF_KINDS] + [f"/v1/_{k}def/names" for k in _TENANT_DEF_KINDS]
)
_TENANT_EXACT = frozenset(
    "/v1/_path /v1/_document /v1/_mcp /v1/_volumes /v1/_volumes/ephemeral /v1/_events /v1/_usage "
    "/v1/_erasure /v1/_retention /v1/_limits /v1/_routing /v1/_models".split()
)
_TENANT_PREFIXES = (
    "/v1/_document/asset/",
    "/v1/_document/changes",
    "/v1/_library/",
    "/v1/_ontology",
    "/v1/_schedules/",
    "/v1/_users/",
    "/v1/_resident",
    "/v1/_memory/",
    "/v1/_channels",
)
_ANY_PATHS = frozenset({"/v1/_llm/chat", "/v1/chat/completions", "/v1/embeddings", "/v1/_me"})
_RUN_WRITE_SUFFIXES = ("/resolve", "/compact", "/cancel", "/input", "/fork")  # /fork: beyond SPEC (apps.runs.fork)
_READ_PREFIXES = ("/v1/runs/", "/v1/agents/", "/v1/users/", "/v1/sessions/")
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _tenant_plane(path: str) -> bool:
    if path in _TENANT_DEF_PATHS or path in _TENANT_EXACT:
        return True
    return path.startswith(_TENANT_PREFIXES) and path != "/v1/_memory/repair-tenant"


def _runs_create(method: str, path: str) -> bool:
    if method != "POST":
        return False
    if path in ("/v1/runs", "/v1/runs:batch"):
        return True
    if path.startswith("/v1/sessions/") and path.endswith(("/messages", "/replay")):
        return True
    if path.startswith("/v1/agents/") and path.endswith("/cancel"):
        return True
    return path.startswith("/v1/runs/") and path.endswith(_RUN_WRITE_SUFFIXES)


def required_scope(method: str, path: str) -> str:
    """SPEC 2.1's table, first match wins. `path` is the full URL path (`/v1/...`, `/ws/...`)."""
    method = method.upper()
    path = path.rstrip("/") or "/"
    if path.startswith("/ws/runs/"):
        return RUNS_READ
    if path.startswith("/ws/channels/"):
        return CHANNEL_READ
    if path in _ANY_PATHS:
        return ANY
    if path == "/v1/_users":
        return TENANT if method == "POST" else ANY
    if path in ("/v1/_history", "/v1/_runnable-agents"):
        return RUNS_READ
    if path == "/v1/client-tools":
        return RUNS_CREATE
    if _tenant_plane(path):
        return TENANT
    if path.startswith("/v1/_"):
        return ADMIN
    if path.startswith("/v1/hooks"):
        return TENANT
    if path == "/metrics":
        return ADMIN
    parts = path.split("/")
    if path.startswith("/v1/users/") and len(parts) > 4 and parts[4] == "channels":
        return CHANNEL_READ if method in ("GET", "HEAD") else CHANNEL_PUBLISH
    if _runs_create(method, path):
        return RUNS_CREATE
    if method == "DELETE" and path.startswith("/v1/runs/") and path.count("/") == 3:
        return RUNS_DELETE
    if method in ("GET", "HEAD") and (path.startswith(_READ_PREFIXES) or path in ("/v1/runs", "/v1/sessions")):
        return RUNS_READ
    return ADMIN if method in _WRITE_METHODS else ANY


def _member_carve_in(scopes: frozenset[str], method: str, path: str) -> bool:
    """A non-isolated tenant member (runs:*/channel:* scopes) may READ the tenant
    plane, except the routes SPEC 2.1 keeps from members. Writes need
    substrate:tenant (docs/compat.md)."""
    if method not in ("GET", "HEAD") or isolated_scopes(scopes) or not scopes & MEMBER_SCOPES:
        return False
    path = path.rstrip("/")
    if path == "/v1/_erasure" or path == "/v1/_memory/changes" or path.startswith("/v1/_document/changes"):
        return False
    return not path.startswith("/v1/hooks")


def authorize(principal: Principal, method: str, path: str) -> None:
    """403 `insufficient_scope` unless the principal holds the route's scope."""
    required = required_scope(method, path)
    if has_scope(principal.scopes, required):
        return
    if required == TENANT and _member_carve_in(principal.scopes, method.upper(), path):
        return
    raise Forbidden(
        "insufficient scope", code="insufficient_scope", headers={"WWW-Authenticate": f'Bearer scope="{required}"'}
    )


def authenticate_for(token: str | None, client_addr: str | None, method: str, path: str) -> Principal:
    """authenticate + authorize, in a worker thread; hands the DB connection back."""
    try:
        principal = authenticate(token, client_addr)
        authorize(principal, method, path)
        return principal
    finally:
        connection.close()


async def aauthenticate_for(token: str | None, client_addr: str | None, method: str, path: str) -> Principal:
    """On the event loop when the answer needs no database (a cached token, or
    open mode as the open-mode cache knows it); else in a worker thread."""
    principal = _fast_principal(token, client_addr)
    if principal is not None:
        authorize(principal, method, path)
        return principal
    return await sync_to_async(authenticate_for, thread_sensitive=False)(token, client_addr, method, path)


def _fast_principal(token: str | None, client_addr: str | None) -> Principal | None:
    if token:
        return auth_cache.lookup(token_hash(token))
    if settings.LOOMCYCLE.auth_token or not is_loopback(client_addr):
        return None  # the slow path answers with the right 401/403
    if open_mode_cached() is True:
        _warn_open_mode()
        return OPEN_PRINCIPAL
    return None


def lower_headers(items: Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in items}


class BearerAuth:
    """django-ninja auth callable for every route; the principal lands in `request.auth`.

    Async so the token lookup runs in a worker thread that returns its DB
    connection at once (an SSE response must not hold one for its lifetime)."""

    openapi_type = "http"
    openapi_scheme = "bearer"
    # ninja declares the scheme (Swagger's Authorize button) from this attribute.
    openapi_security_schema = {"type": "http", "scheme": "bearer"}
    is_async = True

    async def __call__(self, request: HttpRequest) -> Principal:
        token = bearer_from_headers(lower_headers(request.headers.items()))
        return await aauthenticate_for(
            token, request.META.get("REMOTE_ADDR"), request.method or "GET", request.path_info
        )
