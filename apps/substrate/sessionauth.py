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
"""

from __future__ import annotations

from http.cookies import CookieError, SimpleCookie
from importlib import import_module
from types import SimpleNamespace
from urllib.parse import urlparse

from django.conf import settings
from django.contrib.auth import get_user
from django.db import connection

from apps.core.scopes import ADMIN
from apps.core.types import Principal


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
