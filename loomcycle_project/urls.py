from typing import Any

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views import defaults

from apps.core.middleware import API_PREFIXES
from apps.triggers.webhooks.urls import webhook_urlpatterns
from loomcycle_project.api import api, error_response
from loomcycle_project.health import healthz
from loomcycle_project.metrics import metrics_view

urlpatterns = [
    path("healthz", healthz),
    path("metrics", metrics_view),
    path("admin/", admin.site.urls),
    path("v1/", api.urls),
    path("ui/", include("apps.console.urls")),
]

# Inbound webhooks (SPEC 2.10): outside the NinjaAPI's bearer gate, and only when
# enabled. After api.urls, so its admin routes (`{name}/test`) win over `{tenant}/{name}`.
if settings.LOOMCYCLE.webhooks_enabled:
    urlpatterns += webhook_urlpatterns


# API clients get JSON for a path no route matches and for an error outside
# the NinjaAPI's handlers; the admin keeps Django's pages.
def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if request.path.startswith(API_PREFIXES):
        return error_response(404, "not_found", f"no route for {request.method} {request.path[:200]}")
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest, *args: Any) -> HttpResponse:
    if request.path.startswith(API_PREFIXES):
        return error_response(500, "internal_error", "internal server error (logged on the server)")
    return defaults.server_error(request)


handler404 = not_found
handler500 = server_error
