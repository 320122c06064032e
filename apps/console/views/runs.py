"""Runs: the filterable list (GET /v1/runs's selector, apps.runs.pages)."""

from __future__ import annotations

from django import forms
from django.http import HttpRequest, HttpResponse

from apps.console.pages import console_view, render_page
from apps.core.types import Principal
from apps.runs import pages

STATUSES = ["running", "all", "queued", "awaiting_input", "waiting_interrupt", "completed", "failed", "cancelled"]


def _when() -> forms.DateTimeInput:
    return forms.DateTimeInput({"type": "datetime-local"})


class RunFilterForm(forms.Form):
    agent = forms.RegexField(label="Agent", regex=r"^[A-Za-z0-9_.:-]{0,128}$", required=False)
    status = forms.ChoiceField(label="Status", choices=[(s, s) for s in STATUSES], required=False)
    user = forms.RegexField(label="User", regex=r"^[A-Za-z0-9_.:@-]{0,256}$", required=False)
    after = forms.DateTimeField(label="Created after", required=False, widget=_when())
    before = forms.DateTimeField(label="Created before", required=False, widget=_when())
    cursor = forms.CharField(required=False, max_length=400, widget=forms.HiddenInput)


@console_view(rest="GET /v1/runs")
def runs_list(request: HttpRequest, principal: Principal) -> HttpResponse:
    form = RunFilterForm(request.GET or {"status": "all"})
    if not form.is_valid():
        return render_page(request, principal, "console/runs/list.html", {"form": form, "rows": []}, status=400)
    data = form.cleaned_data
    wanted = pages.RunFilter(
        status=data["status"] or "all",
        agent=data["agent"],
        user_id=data["user"],
        created_after=data["after"],
        created_before=data["before"],
    )
    page = pages.runs_page(
        tenant_id=principal.read_tenant, reader=principal.read_user, f=wanted, limit=50, cursor=data["cursor"]
    )
    more = request.GET.copy()
    more["cursor"] = page.next_cursor
    ctx = {"form": form, "rows": page.rows, "next_query": more.urlencode() if page.next_cursor else ""}
    return render_page(request, principal, "console/runs/list.html", ctx)
