"""Runs: the filterable list (GET /v1/runs's selector, apps.runs.pages), a run's page
(timeline, children tree, live tail), cancel, fork from step N, and a comparison of two runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from apps.console.compare import fork_comparison, plain_comparison
from apps.console.pages import console_view, render_page
from apps.core.errors import Invalid
from apps.core.types import Principal
from apps.runs import fork, pages, selectors
from apps.runs.cancel import run_cancel
from apps.runs.statuses import TERMINAL
from apps.runs.timeline import TimelineItem, timeline

if TYPE_CHECKING:
    from apps.runs.models import Run

STATUSES = ["running", "all", "queued", "awaiting_input", "waiting_interrupt", "completed", "failed", "cancelled"]
TIMELINE_LIMIT = 2000
TREE_DEPTH, TREE_WIDTH = 4, 100


def _when() -> forms.DateTimeInput:
    return forms.DateTimeInput({"type": "datetime-local"})


class RunFilterForm(forms.Form):
    agent = forms.RegexField(label="Agent", regex=r"^[A-Za-z0-9_.:-]{0,128}$", required=False)
    status = forms.ChoiceField(label="Status", choices=[(s, s) for s in STATUSES], required=False)
    user = forms.RegexField(label="User", regex=r"^[A-Za-z0-9_.:@-]{0,256}$", required=False)
    after = forms.DateTimeField(label="Created after", required=False, widget=_when())
    before = forms.DateTimeField(label="Created before", required=False, widget=_when())
    cursor = forms.CharField(required=False, max_length=400, widget=forms.HiddenInput)


class ForkForm(forms.Form):
    from_step = forms.IntegerField(label="From step", min_value=0)
    prompt = forms.CharField(label="Next user turn", required=False, max_length=100_000, widget=forms.Textarea)


class CompareForm(forms.Form):
    a = forms.RegexField(label="Run A", regex=r"^[A-Za-z0-9_-]{1,128}$")
    b = forms.RegexField(label="Run B", regex=r"^[A-Za-z0-9_-]{1,128}$")


@dataclass(frozen=True)
class Node:
    run_id: str
    agent: str
    status: str
    children: list[Node]


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


def _run(principal: Principal, run_id: str) -> Run:
    return selectors.run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)


def _items(run_id: str) -> list[TimelineItem]:
    return timeline(selectors.run_events_all(run_id=run_id, limit=TIMELINE_LIMIT))


def _tree(principal: Principal, run: Run, depth: int = 0) -> list[Node]:
    """The run's sub-agent runs as a tree, read as GET /v1/runs/{id}/children reads them."""
    if depth >= TREE_DEPTH:
        return []
    wanted = pages.RunFilter(status="all", parent_id=run.id)
    rows = pages.runs_page(tenant_id=run.tenant_id, reader=principal.read_user, f=wanted, limit=TREE_WIDTH).rows
    return [Node(r.id, r.agent_name, r.status, _tree(principal, r, depth + 1)) for r in reversed(rows)]


@console_view(rest="GET /v1/runs/{run_id}")
def run_page(request: HttpRequest, principal: Principal, run_id: str) -> HttpResponse:
    run = _run(principal, run_id)
    items = _items(run.id)
    ctx = {
        "run": run,
        "items": items,
        "last_seq": items[-1].seq if items else 0,
        "live": run.status not in TERMINAL,
        "children": _tree(principal, run),
        "forks": [f for f in selectors.run_forks(run_id=run.id) if f.tenant_id == run.tenant_id],
        "fork_form": ForkForm(initial={"from_step": max(run.step - 1, 0)}),
    }
    return render_page(request, principal, "console/runs/run.html", ctx)


@require_POST
@console_view(rest="POST /v1/agents/{run_id}/cancel")
def run_cancel_view(request: HttpRequest, principal: Principal, run_id: str) -> HttpResponse:
    out = run_cancel(principal=principal, run_id=run_id, reason="cancelled from the console")
    messages.info(request, "cancelled" if out["cancelled"] else f"already {out['status']}")
    return redirect("console:run", run_id=run_id)


@require_POST
@console_view(rest="POST /v1/runs/{run_id}/fork")
def run_fork_view(request: HttpRequest, principal: Principal, run_id: str) -> HttpResponse:
    form = ForkForm(request.POST)
    if not form.is_valid():
        raise Invalid("from_step must be a step number >= 0", code="invalid_request")
    ask = fork.ForkRequest(from_step=form.cleaned_data["from_step"], prompt=form.cleaned_data["prompt"] or None)
    made = fork.run_fork(principal=principal, run_id=run_id, request=ask)
    messages.info(request, f"forked at step {ask.from_step} as {made.id}")
    return redirect("console:run", run_id=made.id)


@console_view(rest="GET /v1/runs")
def runs_compare(request: HttpRequest, principal: Principal) -> HttpResponse:
    form = CompareForm(request.GET)
    if not form.is_valid():
        return render_page(request, principal, "console/runs/compare.html", {"form": form}, status=400)
    a, b = _run(principal, form.cleaned_data["a"]), _run(principal, form.cleaned_data["b"])
    left, right = _items(a.id), _items(b.id)
    if b.forked_from_run_id == a.id and b.forked_at_step is not None:
        comparison = fork_comparison(left, right, b.forked_at_step)
    else:
        comparison = plain_comparison(left, right)
    ctx = {"form": form, "a": a, "b": b, "comparison": comparison}
    return render_page(request, principal, "console/runs/compare.html", ctx)
