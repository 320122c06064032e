"""Operator-only pages: the runtime's pause switch, snapshots, and the live web and worker
processes. Each applies its REST twin's scope rule (GET/POST /v1/_state, /v1/_pause,
/v1/_snapshots: substrate:admin), so a tenant token gets the API's 403 here too; the runtime
and snapshot ops are the services those routes call."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from apps.console.pages import console_view, render_page
from apps.core.types import Principal
from apps.runs import selectors as runs
from apps.runs import services as runtime
from apps.snapshots import presenters, selectors, services
from loomcycle_project.replicas import replicas as live_processes

RUNTIME_OPS = {"pause", "resume"}


class SnapshotForm(forms.Form):
    label = forms.CharField(label="Label", max_length=256, required=False)


@console_view(rest="* /v1/_state")
def runtime_page(request: HttpRequest, principal: Principal) -> HttpResponse:
    """POST `op=pause` begins a pause without waiting for it (as the admin's switch does: a run
    inside an iteration parks at its boundary and the sweep settles the pause); `op=resume`."""
    if request.method == "POST":
        op = request.POST.get("op", "")
        if op == "pause":
            out = runtime.runtime_pause_start()
            messages.success(request, f"runtime {out['state']}: {out['paused_runs_count']} run(s) paused")
        elif op == "resume":
            out = runtime.runtime_resume()
            messages.success(request, f"runtime running: {out['resumed_runs_count']} run(s) resumed")
        else:
            messages.error(request, f"unknown op {op[:20]!r}: pause or resume")
        return redirect("console:ops-runtime")
    ctx = {
        "state": runtime.runtime_state_get(),
        "paused": runs.paused_runs_count(),
        "live": runs.runs_live_counts(),
        "section": "runtime",
    }
    return render_page(request, principal, "console/ops/runtime.html", ctx)


@console_view(rest="* /v1/_snapshots")
def snapshots_page(request: HttpRequest, principal: Principal) -> HttpResponse:
    form = SnapshotForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        capture = services.snapshot_take(label=form.cleaned_data["label"])
        out = presenters.snapshot_captured_out(capture)
        messages.success(request, f"captured {out['id']} ({out['byte_size']} bytes, {out['runs_captured']} run(s))")
        return redirect("console:ops-snapshots")
    rows = [presenters.snapshot_out(r) for r in selectors.snapshot_list(limit=100)]
    ctx = {"rows": rows, "form": form, "section": "snapshots"}
    return render_page(request, principal, "console/ops/snapshots.html", ctx, status=400 if form.errors else 200)


@console_view(rest="GET /v1/_state")
def replicas_page(request: HttpRequest, principal: Principal) -> HttpResponse:
    """Every live web and worker process (their presence keys in Redis), which /healthz lists for
    an admin only; GET /v1/_state's rule (substrate:admin) is the same test."""
    rows = live_processes()
    ctx = {
        "web": [r for r in rows if r["kind"] == "web"],
        "workers": [r for r in rows if r["kind"] == "worker"],
        "section": "replicas",
    }
    return render_page(request, principal, "console/ops/replicas.html", ctx)
