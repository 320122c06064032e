from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from apps.console.nav import nav_for
from apps.console.pages import console_view
from apps.core.types import Principal


@console_view()
def home(request: HttpRequest, principal: Principal) -> HttpResponse:
    """The first section this principal may use."""
    links = nav_for(principal, request.path)
    return redirect(links[0].href if links else "console:signin")
