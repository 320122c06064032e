"""ASGI guard in front of every route: a NUL character in the path or the
query string is refused before any view or consumer sees it.

Postgres stores no NUL in `text` or `jsonb`, so a `\\u0000` that reached a
query would fail there as a 500. JSON bodies are checked by
apps.core.http.parse_body; this covers what arrives outside the body (path
parameters, `?user_id=%00`, WebSocket query parameters).
"""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]
NUL_MESSAGE = "NUL characters (\\u0000) are not allowed in the path or query string"


def has_nul(scope: Scope) -> bool:
    query = bytes(scope.get("query_string") or b"")
    return "\x00" in str(scope.get("path", "")) or b"%00" in query or b"\x00" in query


async def _refuse_http(send: Any) -> None:
    body = json.dumps({"code": "invalid_request", "error": NUL_MESSAGE, "details": {}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> Any:
        if scope["type"] in ("http", "websocket") and has_nul(scope):
            if scope["type"] == "http":
                return await _refuse_http(send)
            return await send({"type": "websocket.close", "code": 4400})  # a close before accept: 403 handshake
        return await self.app(scope, receive, send)
