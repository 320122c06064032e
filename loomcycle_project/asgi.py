"""ASGI entry point (Daphne): HTTP to Django (but `/v1/_mcp` to the MCP SDK's
transport, apps.mcp.server.http, and the A2A paths to the A2A SDK's, apps.a2a.http),
WebSockets to Channels consumers."""

import os
from typing import Any

from django.core.asgi import get_asgi_application

from loomcycle_project import telemetry
from loomcycle_project.hardening import not_dumpable

not_dumpable()  # the web process's environment holds the secrets too
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loomcycle_project.settings")
telemetry.setup("web")  # before the handler: Django's instrumentation adds its middleware
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from apps.a2a.http import A2AHttpApp, is_a2a_path  # noqa: E402
from apps.channels.routing import websocket_urlpatterns as channel_urlpatterns  # noqa: E402
from apps.core.request_guard import RequestGuard  # noqa: E402
from apps.mcp.server.http import McpHttpApp, is_mcp_path  # noqa: E402
from apps.runs.routing import websocket_urlpatterns as run_urlpatterns  # noqa: E402
from apps.substrate.websocket import browser_origin_validator  # noqa: E402
from loomcycle_project import daphne_limits  # noqa: E402

# Daphne reads request bodies before any of this runs: cap them while they are read.
daphne_limits.install(settings.LOOMCYCLE.max_request_bytes)

_mcp_app = McpHttpApp()
_a2a_app = A2AHttpApp() if settings.LOOMCYCLE.a2a_enabled else None


async def http_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """`/v1/_mcp` is the MCP SDK's ASGI app (it authenticates as the REST API does), the A2A paths
    the A2A SDK's (apps.a2a.http, only when LOOMCYCLE_A2A_ENABLED=1); the rest is Django."""
    if is_mcp_path(scope["path"]):
        return await _mcp_app(scope, receive, send)
    if _a2a_app is not None and is_a2a_path(scope["path"]):
        return await _a2a_app(scope, receive, send)
    return await django_asgi_app(scope, receive, send)


# Browsers send Origin: a page from another site cannot open a socket to us
# (cross-site WebSocket hijacking); clients without an Origin header pass.
application = RequestGuard(
    ProtocolTypeRouter(
        {
            "http": http_app,
            "websocket": browser_origin_validator(URLRouter(run_urlpatterns + channel_urlpatterns)),
        }
    )
)
