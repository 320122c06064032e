"""Sign-in (a pasted bearer, or open mode on loopback) and sign-out."""

from __future__ import annotations

from django import forms
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from apps.console import session
from apps.console.pages import render_page
from apps.core.errors import ApplicationError
from apps.substrate.auth import is_loopback
from apps.substrate.openmode import credential_configured


class SignInForm(forms.Form):
    token = forms.CharField(
        label="Bearer token", required=False, max_length=600, strip=True, widget=forms.PasswordInput
    )
    next = forms.CharField(required=False, widget=forms.HiddenInput)


def _next_url(request: HttpRequest, wanted: str) -> str:
    if wanted and url_has_allowed_host_and_scheme(wanted, {request.get_host()}, request.is_secure()):
        return wanted
    return reverse("console:runs")


@require_http_methods(["GET", "POST"])
def signin(request: HttpRequest) -> HttpResponse:
    form = SignInForm(request.POST or None, initial={"next": request.GET.get("next", "")})
    error = ""
    if request.method == "POST" and form.is_valid():
        try:
            session.sign_in(request, form.cleaned_data["token"] or None)
            return redirect(_next_url(request, form.cleaned_data["next"]))
        except ApplicationError as exc:
            error = "That token was not accepted." if exc.status == 401 else exc.message
    open_mode = is_loopback(request.META.get("REMOTE_ADDR")) and not credential_configured()
    ctx = {"form": form, "error": error, "open_mode": open_mode}
    return render_page(request, None, "console/signin.html", ctx, status=401 if error else 200)


@require_POST
def signout(request: HttpRequest) -> HttpResponse:
    session.sign_out(request)
    return redirect("console:signin")
