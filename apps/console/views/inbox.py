"""Inbox: a user's pending interrupts (GET /v1/users/{user}/interrupts's selector), answered
or declined from the page (POST /v1/runs/{id}/interrupts/{iid}/resolve's service), and the
user's runs awaiting input. The user is the principal's own subject; a tenant operator may
look at another user of its tenant, an isolated end user only at itself (the selector's rule)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from apps.console.pages import console_view, render_page
from apps.core.errors import Invalid
from apps.core.types import Principal
from apps.runs import pages, selectors
from apps.runs.interrupts import services as interrupts

RESOLVER = "console"  # resolved_by of an answer given here (the API's default is "api")


class InboxForm(forms.Form):
    user = forms.RegexField(label="User", regex=r"^[A-Za-z0-9_-]{1,128}$", required=False)


class ResolveForm(forms.Form):
    answer = forms.CharField(label="Answer", required=False, max_length=8192)
    disposition = forms.ChoiceField(label="Disposition", choices=[("answer", "answer"), ("declined", "declined")])
    note = forms.CharField(label="Note", required=False, max_length=8192)
    user = forms.CharField(required=False, max_length=128)


def _user(principal: Principal, wanted: str) -> str:
    return principal.read_user or wanted or principal.subject


@console_view(rest="GET /v1/users/-/interrupts")  # the scope rule of a user's inbox route
def inbox(request: HttpRequest, principal: Principal) -> HttpResponse:
    form = InboxForm(request.GET)
    user = _user(principal, form.cleaned_data["user"] if form.is_valid() else "")
    rows = selectors.interrupts_for_user(tenant_id=principal.read_tenant, user_id=user, reader=principal.read_user)
    wanted = pages.RunFilter(status="awaiting_input", user_id=user)
    waiting = pages.runs_page(tenant_id=principal.read_tenant, reader=principal.read_user, f=wanted, limit=50).rows
    ctx = {"form": form, "user": user, "interrupts": rows, "waiting": waiting}
    return render_page(request, principal, "console/inbox/index.html", ctx)


@console_view(rest="POST /v1/runs/{run_id}/interrupts/{interrupt_id}/resolve")
def resolve(request: HttpRequest, principal: Principal, run_id: str, interrupt_id: str) -> HttpResponse:
    form = ResolveForm(request.POST)
    if not form.is_valid():
        raise Invalid("disposition must be answer or declined", code="invalid_request")
    data = form.cleaned_data
    reply = interrupts.caller_resolve(
        answer=data["answer"] or None,
        disposition=data["disposition"],
        resolved_by=f"{RESOLVER}:{principal.subject}"[:128],
        note=data["note"],
        kind=None,
    )
    interrupts.interrupt_resolve(
        tenant_id=principal.read_tenant,
        owner=principal.read_user,
        run_id=run_id,
        interrupt_id=interrupt_id,
        reply=reply,
    )
    messages.info(request, f"{interrupt_id}: {data['disposition']}")
    return redirect(reverse("console:inbox") + (f"?user={data['user']}" if data["user"] else ""))
