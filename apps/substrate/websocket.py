"""WebSocket handshake checks: cross-site WebSocket hijacking and, in open
mode, DNS rebinding.

Browsers always send `Origin` on a WebSocket handshake, so a page from another
site is refused when its origin is not one of ALLOWED_HOSTS. A client that
sends no Origin at all is not a browser page; it gets through to the bearer
check like any API client (Channels' own validator would refuse it too).

While the runtime is in open mode (apps.substrate.openmode) the handshake must
also name a loopback host, in its
`Host` and in its `Origin`, as HTTP requests must; otherwise it is denied (403).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import ParseResult, urlparse

from channels.security.websocket import OriginValidator, WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port

from apps.substrate.openmode import aopen_mode, host_allowed_in_open_mode


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin1")
    return None


def _scope_domain(scope: dict[str, Any]) -> str:
    host = _header(scope, b"host")
    if host is None:  # as Django falls back to SERVER_NAME
        server = scope.get("server") or ("", None)
        host = str(server[0] or "")
        if ":" in host:
            host = f"[{host}]"
    return split_domain_port(host)[0]


def _origin_domain(origin: ParseResult) -> str:
    hostname = origin.hostname or ""
    return f"[{hostname}]" if ":" in hostname else hostname


class BrowserOriginValidator(OriginValidator):
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("BrowserOriginValidator serves WebSocket connections only")
        raw_origin = _header(scope, b"origin")
        try:
            origin = urlparse(raw_origin) if raw_origin is not None else None
            allowed = self.valid_origin(origin)
        except ValueError:  # a malformed Origin (bad IPv6 literal or port)
            allowed = False
        if allowed and await self._open_mode_allows(scope, origin):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    def valid_origin(self, parsed_origin: ParseResult | None) -> bool:
        if parsed_origin is None:
            return True
        # settings.ALLOWED_HOSTS per handshake, as Django reads it per request.
        return any(p == "*" or self.match_allowed_origin(parsed_origin, p) for p in settings.ALLOWED_HOSTS)

    async def _open_mode_allows(self, scope: dict[str, Any], origin: ParseResult | None) -> bool:
        local = host_allowed_in_open_mode(_scope_domain(scope)) and (
            origin is None or host_allowed_in_open_mode(_origin_domain(origin))
        )
        return local or not await aopen_mode()


def browser_origin_validator(application: Any) -> BrowserOriginValidator:
    return BrowserOriginValidator(application, settings.ALLOWED_HOSTS)
