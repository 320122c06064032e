"""A Django admin session as a WebSocket principal: the run console's live
tail opens the run WebSocket from the admin page, with the admin's session
cookie and no bearer.

Cookies ride along on any handshake a browser makes, including one a page of
another site starts (cross-site WebSocket hijacking), and ALLOWED_HOSTS may
be `*`. So a session counts only on a same-origin handshake: its `Origin`
must name exactly the `Host` it was sent to. The session must belong to an
active staff user holding the permission asked for; the principal is then
the operator (`admin:<username>`, the admin scope), as in the admin itself.
A password change logs the session out here too (Django's session hash).

The web console (apps.console) keeps a bearer's reference in its session: the
functions at the end of this module.
"""

from __future__ import annotations

import hashlib
import hmac
from http.cookies import CookieError, SimpleCookie
from importlib import import_module
from types import SimpleNamespace
from urllib.parse import urlparse

from django.conf import settings
from django.contrib.auth import get_user
from django.db import DatabaseError, connection

from apps.core.errors import Forbidden, Unauthorized
from apps.core.scopes import ADMIN
from apps.core.types import Principal
from apps.substrate.auth import LEGACY_PRINCIPAL, AuthUnavailable, authenticate, principal_for_digest
from apps.substrate.tokens import live_admin_token_exists, token_hash


def same_origin(headers: dict[str, str]) -> bool:
    """Whether the handshake's Origin is the very host:port it was sent to."""
    origin, host = headers.get("origin", ""), headers.get("host", "")
    if not origin or not host:
        return False
    try:
        parsed = urlparse(origin)
    except ValueError:
        return False
    return parsed.scheme in ("http", "https") and parsed.netloc.lower() == host.lower()


def _session_key(headers: dict[str, str]) -> str | None:
    try:
        morsel = SimpleCookie(headers.get("cookie", "")).get(settings.SESSION_COOKIE_NAME)
    except CookieError:
        return None
    return morsel.value if morsel is not None and morsel.value else None


def session_principal(headers: dict[str, str], *, permission: str) -> Principal | None:
    """The operator principal of a same-origin handshake carrying the session
    of an active staff user with `permission`; None otherwise."""
    key = _session_key(headers)
    if key is None or not same_origin(headers):
        return None
    try:
        session = import_module(settings.SESSION_ENGINE).SessionStore(session_key=key)
        user = get_user(SimpleNamespace(session=session))  # type: ignore[arg-type]
        if not (user.is_active and user.is_staff and user.has_perm(permission)):
            return None
        return Principal(tenant_id="", subject=f"admin:{user.get_username()}", scopes=frozenset({ADMIN}))
    finally:
        connection.close()


# --- the web console's sessions (apps.console) -------------------------------------------
#
# A pasted bearer is verified by `authenticate` (the REST API's path) and the session keeps a
# reference to it, never the token: `token:<stored hash>` for an operator token,
# `legacy:<sha256>` for LOOMCYCLE_AUTH_TOKEN, `open` for open mode. Every console request
# resolves the reference again, through the same token cache as a bearer, so a retired token
# stops working as soon as a bearer would (the cache's epoch: LOOMCYCLE_AUTH_EPOCH_CHECK_MS).


def console_reference(token: str | None, client_addr: str | None) -> tuple[Principal, str]:
    """Verify a pasted bearer (None: open mode) as the REST API does; its principal and the
    reference a session keeps. Raises 401/403/503 as `authenticate` does."""
    principal = authenticate(token or None, client_addr)
    if principal.open_mode:
        return principal, "open"
    assert token  # only open mode authenticates without one
    if principal.legacy:
        return principal, "legacy:" + hashlib.sha256(token.encode()).hexdigest()
    return principal, "token:" + token_hash(token)


def console_principal(reference: str, client_addr: str | None) -> Principal | None:
    """The principal a session's reference stands for now; None once it no longer
    authenticates (retired token, open mode ended, a legacy token superseded)."""
    kind, _, value = reference.partition(":")
    try:
        if kind == "token":
            return principal_for_digest(value)
        if kind == "open":
            principal = authenticate(None, client_addr)
            return principal if principal.open_mode else None
        if kind == "legacy":
            return _legacy_principal(value)
    except (Unauthorized, Forbidden):
        return None
    except DatabaseError as exc:
        raise AuthUnavailable("authentication is unavailable: the token store cannot be read") from exc
    return None


def _legacy_principal(digest: str) -> Principal | None:
    configured = settings.LOOMCYCLE.auth_token
    if not configured:
        return None
    same = hmac.compare_digest(hashlib.sha256(configured.encode()).hexdigest(), digest)
    return LEGACY_PRINCIPAL if same and not live_admin_token_exists() else None
