"""Bearer -> principal, used by every route and by the WebSocket consumers.

This build knows one credential: LOOMCYCLE_AUTH_TOKEN (compared in constant
time over SHA-256 digests), which maps to the shared-tenant admin. With no
token configured the runtime is open, and serves loopback clients only.
OperatorTokenDef tokens (tenants, scopes) arrive with the substrate issue.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from typing import Any

from django.conf import settings
from django.http import HttpRequest

from apps.core.errors import Forbidden, Unauthorized
from apps.core.types import Principal

log = logging.getLogger("loomcycle.auth")

ADMIN = frozenset({"substrate:admin"})
OPEN_PRINCIPAL = Principal(tenant_id="", subject="open-mode", scopes=ADMIN, open_mode=True)
LEGACY_PRINCIPAL = Principal(tenant_id="", subject="legacy-token", scopes=ADMIN)


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


def authenticate(token: str | None, client_addr: str | None) -> Principal:
    configured = settings.LOOMCYCLE.auth_token
    if not configured:
        if not is_loopback(client_addr):
            raise Forbidden(
                "open mode (no LOOMCYCLE_AUTH_TOKEN) serves loopback clients only", code="open_mode_loopback"
            )
        return OPEN_PRINCIPAL
    if token and hmac.compare_digest(_digest(token), _digest(configured)):
        return LEGACY_PRINCIPAL
    raise Unauthorized("unauthorized")


class BearerAuth:
    """django-ninja auth callable; the principal lands in `request.auth`."""

    openapi_type = "http"
    openapi_scheme = "bearer"

    def __call__(self, request: HttpRequest) -> Principal:
        headers: dict[str, Any] = {k.lower(): v for k, v in request.headers.items()}
        return authenticate(bearer_from_headers(headers), request.META.get("REMOTE_ADDR"))
