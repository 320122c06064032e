"""The console's sign-in: a pasted bearer becomes a Django session.

The bearer is verified by the REST API's own path (apps.substrate.auth.authenticate,
through apps.substrate.sessionauth.console_reference) and the session keeps only a
reference to it (the token's stored hash, `open` or the legacy token's digest), never
the token text; nothing of it reaches the browser but the session cookie (HttpOnly,
SameSite=Lax, Secure on HTTPS: apps.core.middleware.SecureCookiesMiddleware). Every
console request resolves that reference again (`session_principal`), so a retired
token's session ends as soon as the token would 401 as a bearer (within
LOOMCYCLE_AUTH_EPOCH_CHECK_MS).
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import HttpRequest

from apps.core.types import Principal
from apps.substrate.sessionauth import console_principal, console_reference

SESSION_KEY = "lc_console_ref"


def sign_in(request: HttpRequest, token: str | None) -> Principal:
    """Verify `token` (None: open mode) and bind the session to it; raises 401/403/503 as a
    bearer would. The session key is cycled (no fixation)."""
    principal, reference = console_reference(token, request.META.get("REMOTE_ADDR"))
    request.session.cycle_key()
    request.session[SESSION_KEY] = reference
    return principal


def sign_out(request: HttpRequest) -> None:
    """Delete the session row and its cookie."""
    request.session.flush()


def session_principal(request: HttpRequest) -> Principal | None:
    """The principal this request's session stands for now; None (and the session
    flushed) when there is none or its token no longer authenticates."""
    reference = request.session.get(SESSION_KEY)
    if not isinstance(reference, str):
        return None
    principal = console_principal(reference, request.META.get("REMOTE_ADDR"))
    if principal is None:
        request.session.flush()
    return principal


async def asession_principal(request: HttpRequest) -> Principal | None:
    """`session_principal` for async views (a stream): the session read and the token
    check run on a worker thread that hands its DB connection back."""

    def body() -> Principal | None:
        try:
            reference = request.session.get(SESSION_KEY)
            if not isinstance(reference, str):
                return None
            return console_principal(reference, request.META.get("REMOTE_ADDR"))
        finally:
            connection.close()

    return await sync_to_async(body, thread_sensitive=False)()
