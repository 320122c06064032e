"""What every console view shares: the session gate (`console_view`) and the page
renderer (`render_page`).

`console_view` gives a view the Principal of its session (re-checked on every request:
apps.console.session), redirects to the sign-in page without one, applies the scope
rule of the view's REST twin (apps.substrate.auth.authorize on the named route, the
same table the API uses) and turns a service's ApplicationError into an error page
with the same status and code the API would answer (another tenant's run is a 404
here as there).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import update_wrapper
from typing import Any, Concatenate, ParamSpec
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect

from apps.console.nav import nav_for
from apps.console.session import session_principal
from apps.core.errors import ApplicationError
from apps.core.types import Principal
from apps.substrate.auth import authorize

P = ParamSpec("P")
ConsoleView = Callable[Concatenate[HttpRequest, Principal, P], HttpResponse]


def signin_redirect(request: HttpRequest) -> HttpResponse:
    """To the sign-in page, back here after it; an htmx request gets HX-Redirect (a
    partial swap of the sign-in page into a fragment would be wrong)."""
    target = reverse("console:signin") + "?" + urlencode({"next": request.get_full_path()})
    if request.headers.get("HX-Request"):
        return HttpResponseClientRedirect(target)
    return redirect(target)


def console_view(rest: str = "") -> Callable[[ConsoleView[P]], Callable[Concatenate[HttpRequest, P], HttpResponse]]:
    """Decorate `view(request, principal, **url_kwargs)`. `rest` names the REST route
    whose scope rule applies, as "METHOD /v1/path/{kwarg}" (METHOD `*` = this request's)."""

    def wrap(view: ConsoleView[P]) -> Callable[Concatenate[HttpRequest, P], HttpResponse]:
        def inner(request: HttpRequest, /, *args: P.args, **kwargs: P.kwargs) -> HttpResponse:
            principal = session_principal(request)
            if principal is None:
                return signin_redirect(request)
            try:
                if rest:
                    method, _, path = rest.partition(" ")
                    method = (request.method or "GET") if method == "*" else method
                    authorize(principal, method, path.format(**kwargs))
                return view(request, principal, *args, **kwargs)
            except ApplicationError as exc:
                return error_page(request, principal, exc)

        update_wrapper(inner, view)  # a statement: the wrapper's type stays the one declared
        return inner

    return wrap


def render_page(
    request: HttpRequest,
    principal: Principal | None,
    template: str,
    context: Mapping[str, Any] | None = None,
    *,
    status: int = 200,
) -> HttpResponse:
    """`template` (which extends console/base.html) with the nav and principal filled in."""
    ctx = {"principal": principal, "nav": nav_for(principal, request.path) if principal else [], **(context or {})}
    return render(request, template, ctx, status=status)


def error_page(request: HttpRequest, principal: Principal | None, exc: ApplicationError) -> HttpResponse:
    """The API's status and code as a page, or as a fragment for an htmx request (console.js
    lets htmx swap 4xx answers into the request's target)."""
    ctx = {"status": exc.status, "code": exc.code, "message": exc.message}
    template = "console/_error.html" if request.headers.get("HX-Request") else "console/error.html"
    return render_page(request, principal, template, ctx, status=exc.status)
