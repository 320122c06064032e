"""Memory: the rows of one (scope, scope_id) in the caller's tenant, by key prefix, and a
vector search over them. Both are the operator plane's verbs REST calls (apps.memory.keyops):
the tenant is the credential's, so another tenant's rows are simply absent."""

from __future__ import annotations

from typing import Any

from django import forms
from django.http import HttpRequest, HttpResponse

from apps.console.pages import console_view, render_page
from apps.core.types import Principal
from apps.memory import keyops

SCOPES = [("tenant", "tenant"), ("global", "global"), ("agent", "agent"), ("user", "user")]


class SlotForm(forms.Form):
    scope = forms.ChoiceField(label="Scope", choices=SCOPES, initial="tenant")
    scope_id = forms.CharField(label="Scope id (agent name or user id)", required=False, max_length=256)
    key_prefix = forms.CharField(label="Key prefix", required=False, max_length=512)  # `prefix` is Form's own
    limit = forms.IntegerField(label="At most", min_value=1, max_value=1000, initial=100)


class SearchForm(forms.Form):
    query = forms.CharField(label="Search (meaning, not words)", max_length=4000)
    scope = forms.ChoiceField(label="Scope", choices=SCOPES, initial="tenant")
    scope_id = forms.CharField(label="Scope id", required=False, max_length=256)
    top_k = forms.IntegerField(label="Best", min_value=1, max_value=50, initial=10)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", "search_%s")  # beside SlotForm on one page: ids of its own
        super().__init__(*args, **kwargs)


def _page(request: HttpRequest, principal: Principal, extra: dict[str, Any], status: int = 200) -> HttpResponse:
    ctx: dict[str, Any] = {"form": SlotForm(initial={"scope": "tenant", "limit": 100}), "listing": None}
    ctx |= {"search_form": SearchForm(initial={"scope": "tenant", "top_k": 10}), "found": None} | extra
    return render_page(request, principal, "console/memory/index.html", ctx, status=status)


@console_view(rest="GET /v1/_memory/scopes")
def memory(request: HttpRequest, principal: Principal) -> HttpResponse:
    form = SlotForm(request.GET or {"scope": "tenant", "limit": 100})
    if not form.is_valid():
        return _page(request, principal, {"form": form}, status=400)
    d = form.cleaned_data
    listing = keyops.keys_list(principal, d["scope"], d["scope_id"], d["key_prefix"], str(d["limit"]))
    return _page(request, principal, {"form": form, "listing": listing})


@console_view(rest="POST /v1/_memory/search")
def memory_search(request: HttpRequest, principal: Principal) -> HttpResponse:
    """A read, so a GET form; its scope rule is REST's POST /v1/_memory/search."""
    form = SearchForm(request.GET)
    if not form.is_valid():
        return _page(request, principal, {"search_form": form}, status=400)
    found = keyops.search(principal, keyops.MemorySearchIn(**form.cleaned_data))
    return _page(request, principal, {"search_form": form, "found": found})
