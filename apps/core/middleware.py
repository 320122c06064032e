"""Browser middleware that the JSON API does not run.

Django's session, CSRF, auth, messages, security-header and static-file
middleware serve the admin. On an async request each of them costs a hop to
Django's one sync thread (MiddlewareMixin wraps process_request/response in
sync_to_async), and together they were most of the LLM gateway's added
latency (docs/performance.md). `api_bypass(path)` wraps one of them so that
requests under API_PREFIXES go straight to the next layer; every other path
(the admin, static files) gets the middleware as before. The API needs none
of them: it authenticates with bearer tokens, sets no cookies, and its views
are CSRF-exempt. The Host check that CommonMiddleware performed (Django's
ALLOWED_HOSTS) is kept for API requests here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest
from django.utils.module_loading import import_string

API_PREFIXES = ("/v1/", "/healthz", "/metrics")


def api_bypass(inner_path: str) -> type:
    """A subclass of the middleware at `inner_path` (so Django adapts it as
    before, and the admin's middleware checks still find it) that passes API
    requests through untouched."""
    inner_cls: Any = import_string(inner_path)

    class ApiBypass(inner_cls):
        def __call__(self, request: HttpRequest) -> Any:
            if request.path_info.startswith(API_PREFIXES):
                request.get_host()  # ALLOWED_HOSTS, as CommonMiddleware checked it: DisallowedHost -> 400
                return self.get_response(request)  # a coroutine in async mode: the caller awaits it
            return super().__call__(request)

    ApiBypass.__name__ = ApiBypass.__qualname__ = f"ApiBypass{inner_cls.__name__}"
    return ApiBypass


SecurityMiddleware = api_bypass("django.middleware.security.SecurityMiddleware")
WhiteNoiseMiddleware = api_bypass("whitenoise.middleware.WhiteNoiseMiddleware")
SessionMiddleware = api_bypass("django.contrib.sessions.middleware.SessionMiddleware")
CommonMiddleware = api_bypass("django.middleware.common.CommonMiddleware")
CsrfViewMiddleware = api_bypass("django.middleware.csrf.CsrfViewMiddleware")
AuthenticationMiddleware = api_bypass("django.contrib.auth.middleware.AuthenticationMiddleware")
MessageMiddleware = api_bypass("django.contrib.messages.middleware.MessageMiddleware")
XFrameOptionsMiddleware = api_bypass("django.middleware.clickjacking.XFrameOptionsMiddleware")


class HybridMiddleware(ABC):
    """A middleware that runs natively in both modes (no hop to the sync
    thread on async requests): subclasses implement `sync_call` and `async_call`."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.async_call(request)
        return self.sync_call(request)

    @abstractmethod
    def sync_call(self, request: HttpRequest) -> Any:
        """The middleware for a request in sync mode."""

    @abstractmethod
    async def async_call(self, request: HttpRequest) -> Any:
        """The same in async mode."""


class SecureCookiesMiddleware(HybridMiddleware):
    """Mark every cookie Secure on a response to an HTTPS request (as Django
    sees it: TLS, or SECURE_PROXY_SSL_HEADER behind a proxy), so the admin's
    session and CSRF cookies never travel in clear once TLS is in use, while a
    plain-HTTP loopback admin keeps working."""

    def sync_call(self, request: HttpRequest) -> Any:
        return _secure_cookies(request, self.get_response(request))

    async def async_call(self, request: HttpRequest) -> Any:
        return _secure_cookies(request, await self.get_response(request))


def _secure_cookies(request: HttpRequest, response: Any) -> Any:
    if request.is_secure():
        for morsel in response.cookies.values():
            morsel["secure"] = True
    return response
