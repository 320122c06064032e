"""The one NinjaAPI: routers of every app and every exception handler."""

from __future__ import annotations

import logging

from django.db import DataError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja.errors import AuthenticationError, HttpError, ValidationError

from apps.core.database import connection_lost
from apps.core.errors import ApplicationError
from apps.runs.api import router as runs_router
from apps.substrate.api import mount as substrate_routes
from apps.substrate.auth import BearerAuth
from loomcycle_project.openapi import LoomcycleAPI

log = logging.getLogger("loomcycle.api")

DATABASE_RETRY_AFTER_S = 2  # a restart of Postgres takes seconds

api = LoomcycleAPI(
    title="loomcycle",
    version="1",
    urls_namespace="v1",
    docs_url="/docs",
    openapi_url="/openapi.json",
    auth=BearerAuth(),
)
api.add_router("/", runs_router)
api.add_router("/", substrate_routes())
api.add_router("/", "apps.substrate.api_auth.router")
api.add_router("/", "apps.substrate.api_presets.router")
api.add_router("/", "apps.runs.api.concurrency.router")
api.add_router("/", "apps.runs.api.interrupts.router")
api.add_router("/", "apps.runs.api.compaction.router")
api.add_router("/", "apps.runs.api.sessions.router")
api.add_router("/", "apps.runs.api.turnfork.router")
api.add_router("/", "apps.runs.api.batch.router")
api.add_router("/", "apps.lifecycle.api.router")
api.add_router("/", "apps.runs.api.listing.router")
api.add_router("/", "apps.gateway.api.router")
api.add_router("/", "apps.memory.api.router")
api.add_router("/", "apps.channels.api.router")
api.add_router("/", "apps.triggers.hooks.api.router")
api.add_router("/", "apps.triggers.webhooks.api.router")
api.add_router("/", "apps.tools.api.router")
api.add_router("/", "apps.triggers.api.router")
api.add_router("/", "apps.snapshots.api.router")
api.add_router("/", "apps.budgets.api.router")


def error_response(status: int, code: str, message: str, details: dict[str, object] | None = None) -> JsonResponse:
    return JsonResponse({"code": code, "error": message, "details": details or {}}, status=status)


@api.exception_handler(ApplicationError)
def on_application_error(request: HttpRequest, exc: ApplicationError) -> HttpResponse:
    response = JsonResponse(exc.body(), status=exc.status)
    for key, value in exc.headers.items():
        response[key] = value
    return response


@api.exception_handler(AuthenticationError)
def on_auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return error_response(401, "unauthorized", "unauthorized")


@api.exception_handler(ValidationError)
def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    return error_response(400, "invalid_request", "request did not validate", {"errors": exc.errors})


@api.exception_handler(DataError)
def on_data_error(request: HttpRequest, exc: DataError) -> HttpResponse:
    """A value the store refused (too long for its column, out of range): the
    request's data, so a 400; routes validate first, this is the backstop."""
    log.warning("%s %s: the store refused a value: %s", request.method, request.path, exc)
    return error_response(400, "invalid_value", "a value in the request cannot be stored (too long or out of range)")


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def on_database_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    """The database went away (a Postgres restart): a 503 the client may retry, not our bug."""
    if not connection_lost(exc):
        return on_unexpected_error(request, exc)
    log.warning("%s %s: database unavailable: %s", request.method, request.path, exc)
    response = error_response(503, "database_unavailable", "the database is unavailable; retry shortly")
    response["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
    return response


@api.exception_handler(Exception)
def on_unexpected_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    """Anything else is our bug: logged with its traceback, answered as JSON."""
    log.error("%s %s: unhandled error", request.method, request.path, exc_info=exc)
    return error_response(500, "internal_error", "internal server error (logged on the server)")


@api.exception_handler(HttpError)
def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return error_response(exc.status_code, "http_error", str(exc))
