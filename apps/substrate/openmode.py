"""Open mode answers loopback host names only (protection against DNS
rebinding) and same-machine browser pages only (protection against cross-site
requests).

Open mode makes every loopback client an unauthenticated admin, so it holds
only while nothing says the runtime is deployed: no LOOMCYCLE_AUTH_TOKEN, no
live OperatorTokenDef of any scope (a tenant's token means people use this
runtime), and no host name but loopback ones in LOOMCYCLE_ALLOWED_HOSTS (a
configured public name means a proxy or a DNS name fronts it). Behind a
reverse proxy on the same machine every internet client is a loopback peer
naming `127.0.0.1`, so each of these ends it; with none of them the runtime
answers nobody until a token is minted. A bearer that is presented but is no
token is a 401 even in open mode (apps.substrate.auth), never the admin.

A web page on a rebound DNS name (evil.example -> 127.0.0.1) would be a
loopback client too, so while the runtime is open a request must name a
loopback host (localhost, *.localhost, 127.0.0.1, [::1]). Once a credential
exists the bearer is the boundary and any host Django allows is served.

A web page on any site can also make the developer's browser send a "simple"
cross-site request (a form POST, which the body parser reads as JSON so that
`curl -d` works) to 127.0.0.1. While the runtime is open such a request is
refused with 403 `cross_site_request` when the browser marks it `Sec-Fetch-Site:
cross-site` or its `Origin` is not a loopback origin. Clients that send neither header (curl, SDKs) are not browser
pages and pass; once a credential exists a browser cannot attach the bearer on
its own, so the check stops.

The decision is made per request, because an operator token minted at runtime
closes open mode: the database answer is cached per process for OPEN_MODE_TTL_S,
and a database error fails closed: a foreign host is refused with 503
`database_unavailable` (the server's outage, not the client's mistake), a
loopback one is served and authentication itself answers 503.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.request import split_domain_port, validate_host

from apps.core.errors import ApplicationError, Forbidden, Invalid
from apps.core.middleware import HybridMiddleware
from apps.core.types import Principal
from apps.substrate import auth_cache
from apps.substrate.tokens import live_admin_token_exists, live_token_exists

log = logging.getLogger("loomcycle.open_mode")

OPEN_MODE_TTL_S = 2.0
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
OPEN_MODE_HOST_MESSAGE = (
    "open mode (no token configured) answers loopback host names only (localhost, 127.0.0.1, [::1]); "
    "mint a token (`manage.py token create --name admin --tenant ops`) to serve other names"
)
CROSS_SITE_MESSAGE = (
    "open mode (no token configured) refuses requests from web pages of other sites; "
    "call the API from a client that sends no Origin (curl, an SDK), or configure a token"
)

_clock: Callable[[], float] = time.monotonic
_cached: tuple[float, bool] | None = None  # (expires at, no live admin token)
_cached_epoch: int | None = None  # the auth epoch the answer was read under


def reset_open_mode_cache() -> None:
    global _cached
    _cached = None


def is_loopback_name(domain: str) -> bool:
    """`domain` as split_domain_port returns it: lower case, no port, IPv6 in brackets."""
    return domain in LOOPBACK_NAMES or domain.endswith(".localhost")


def host_allowed_in_open_mode(domain: str) -> bool:
    """A loopback name, or one Django's ALLOWED_HOSTS lists explicitly (`*` does not count).
    An operator's public LOOMCYCLE_ALLOWED_HOSTS name ends open mode itself, so in practice
    the explicit names served here are loopback ones and those a test runner adds."""
    if is_loopback_name(domain):
        return True
    explicit = [h for h in settings.ALLOWED_HOSTS if h != "*"]
    return bool(domain) and validate_host(domain, explicit)


def public_host_configured() -> bool:
    """LOOMCYCLE_ALLOWED_HOSTS names a host that is not a loopback name (`*` is none)."""
    return any(h != "*" and not is_loopback_name(h.lstrip(".")) for h in settings.LOOMCYCLE.allowed_hosts)


def credential_configured() -> bool:
    """Open mode is over: LOOMCYCLE_AUTH_TOKEN or a public LOOMCYCLE_ALLOWED_HOSTS name is
    configured, or a live OperatorTokenDef of any scope exists (uncached)."""
    return bool(settings.LOOMCYCLE.auth_token) or public_host_configured() or live_token_exists()


def admin_credential_missing() -> bool:
    """No LOOMCYCLE_AUTH_TOKEN and no live admin token: once open mode is over (a tenant's
    token, a public host name), nobody can administer the runtime over the API (up says so)."""
    return not settings.LOOMCYCLE.auth_token and not live_admin_token_exists()


def remember_open_mode(answer: bool) -> None:
    """Cache a genuine answer (read from the token table) for OPEN_MODE_TTL_S,
    or until a token write anywhere bumps the auth epoch."""
    global _cached, _cached_epoch
    _cached_epoch = auth_cache.current_epoch()
    _cached = (_clock() + OPEN_MODE_TTL_S, answer)


auth_cache.on_forget(reset_open_mode_cache)


def open_mode(*, close_connection: bool = False) -> bool:
    """True while no credential is configured (or while that cannot be read: loopback names only
    then). `close_connection` hands the DB connection back after a lookup (for worker threads of
    async callers)."""
    return open_mode_state(close_connection=close_connection) is not False


def open_mode_state(*, close_connection: bool = False) -> bool | None:
    """`open_mode`, with None when the token store could not be read (nothing is cached then:
    authentication reads the table itself and fails closed with 503)."""
    cached = open_mode_cached()
    if cached is not None:
        return cached
    try:
        answer = not credential_configured()
    except DatabaseError as exc:
        log.error("open mode check: token store lookup failed; answering loopback host names only: %s", exc)
        return None
    finally:
        if close_connection:
            connection.close()
    remember_open_mode(answer)
    return answer


def open_mode_cached() -> bool | None:
    """What the open-mode cache knows right now (None: expired, look it up)."""
    if settings.LOOMCYCLE.auth_token or public_host_configured():
        return False
    cached = _cached
    if cached is not None and _clock() < cached[0] and auth_cache.current_epoch() == _cached_epoch:
        return cached[1]
    return None


async def aopen_mode() -> bool:
    return await aopen_mode_state() is not False


async def aopen_mode_state() -> bool | None:
    cached = open_mode_cached()
    if cached is not None:
        return cached
    return await sync_to_async(open_mode_state, thread_sensitive=False)(close_connection=True)


def request_domain(request: HttpRequest) -> str:
    """The Host the client named (not validated against ALLOWED_HOSTS; Django does that later)."""
    host = request.META.get("HTTP_HOST") or request.META.get("SERVER_NAME") or ""
    return split_domain_port(str(host))[0]


def open_mode_host_refused() -> JsonResponse:
    body = {"code": "open_mode_host", "error": OPEN_MODE_HOST_MESSAGE, "details": {}}
    return JsonResponse(body, status=400)


def origin_allowed_in_open_mode(origin: str) -> bool:
    """An http(s) origin naming a host open mode serves; `null` and anything
    else (file:, data:, sandboxed frames) is not."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    return host_allowed_in_open_mode(split_domain_port(parts.netloc.lower())[0])


def is_cross_site(request: HttpRequest) -> bool:
    """The browser says the request comes from another site, or from an origin
    open mode does not serve. No header at all: not a browser page."""
    if request.headers.get("Sec-Fetch-Site", "").lower() == "cross-site":
        return True
    origin = request.headers.get("Origin")
    return origin is not None and not origin_allowed_in_open_mode(origin)


def cross_site_refused() -> JsonResponse:
    body = {"code": "cross_site_request", "error": CROSS_SITE_MESSAGE, "details": {}}
    return JsonResponse(body, status=403)


def token_store_unavailable() -> JsonResponse:
    """Whether open mode holds is unknown (the database is unreachable): refused, but as the
    server's outage it is (503, as loomcycle_project.api answers a lost database), not as the
    client's mistake: a deployed runtime's clients name its public host, and a 400
    `open_mode_host` would tell them to call a loopback name instead."""
    body = {"code": "database_unavailable", "error": "the database is unavailable; retry shortly", "details": {}}
    response = JsonResponse(body, status=503)
    response["Retry-After"] = "2"
    return response


def open_mode_refusal(request: HttpRequest, is_open: Callable[[], bool | None]) -> JsonResponse | None:
    """The refusal for a request open mode must not serve, or None (`is_open`: open_mode_state).
    The header checks run first so that a plain API request costs no open-mode lookup."""
    if not host_allowed_in_open_mode(request_domain(request)):
        state = is_open()
        if state is None:
            return token_store_unavailable()
        if state:
            return open_mode_host_refused()
    if is_cross_site(request) and is_open() is not False:
        log.warning(
            "open mode: refused a cross-site %s %s (Origin %r)",
            request.method,
            request.path,
            request.headers.get("Origin"),
        )
        return cross_site_refused()
    return None


class OpenModeHostMiddleware(HybridMiddleware):
    """While the runtime is in open mode: 400 `open_mode_host` for a
    non-loopback Host, 403 `cross_site_request` for a cross-site browser request."""

    def sync_call(self, request: HttpRequest) -> Any:
        refusal = open_mode_refusal(request, open_mode_state)
        return refusal if refusal is not None else self.get_response(request)

    async def async_call(self, request: HttpRequest) -> HttpResponse:
        if not host_allowed_in_open_mode(request_domain(request)) or is_cross_site(request):
            is_open = await aopen_mode_state()
            refusal = open_mode_refusal(request, lambda: is_open)
            if refusal is not None:
                return refusal
        get_response: Callable[[HttpRequest], Awaitable[HttpResponse]] = self.get_response
        return await get_response(request)


def host_refusal(headers: dict[str, str], principal: Principal | None) -> ApplicationError | None:
    """What Django's middleware would refuse for this Host/Origin, for the ASGI apps mounted ahead of it
    (MCP, A2A), which Django's middleware does not see (principal None: not yet known)."""
    domain = split_domain_port(headers.get("host", ""))[0]
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return Invalid("the Host header names a host this runtime does not serve", code="disallowed_host")
    if principal is None or not principal.open_mode:
        return None
    if not host_allowed_in_open_mode(domain):
        return Invalid(OPEN_MODE_HOST_MESSAGE, code="open_mode_host")
    origin = headers.get("origin")
    cross = headers.get("sec-fetch-site", "").lower() == "cross-site"
    if cross or (origin is not None and not origin_allowed_in_open_mode(origin)):
        return Forbidden(CROSS_SITE_MESSAGE, code="cross_site_request")
    return None
