"""The run console: runs in the Django admin.

Read-only views over apps.runs.selectors (no add, edit or delete), and
operator actions that call the same services the REST API calls (cancel,
runtime pause/resume, fork from a step: apps.runs.fork) or
apps.runs.operations (retry a failed run, bulk cancel), as the principal
`admin:<username>` with the admin scope (a fork: within the run's own tenant). Viewing
needs `runs.view_run`, acting `runs.change_run`. A refusal is a message on
the page, never a 500. The admin holds no run logic of its own.
"""

from __future__ import annotations

import enum
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from apps.core.errors import ApplicationError
from apps.core.ids import IDENT_RE
from apps.core.scopes import ADMIN
from apps.core.types import Principal
from apps.gateway.selectors import UsageTotals, usage_totals_by_run
from apps.runs import operations, selectors, services
from apps.runs.completion import admin as completion_admin  # noqa: F401  (registers the deliveries' pages)
from apps.runs.fork import ForkRequest, run_fork
from apps.runs.models import TERMINAL, Run, RunStatus
from apps.runs.timeline import timeline

TIMELINE_LIMIT = 5000


class Verb(enum.StrEnum):
    CANCEL = "cancel"
    RETRY = "retry"


SHARED = "(shared)"


def operator(request: HttpRequest, tenant_id: str = "") -> Principal:
    """The admin user as a principal: the operator plane, every tenant (reads); `tenant_id`
    is the tenant it writes in (a fork belongs to its source's tenant)."""
    subject = f"admin:{request.user.get_username()}"
    return Principal(tenant_id=tenant_id, subject=subject, scopes=frozenset({ADMIN}))


class _DistinctFilter(admin.SimpleListFilter):
    column = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(v or SHARED, v or SHARED) for v in selectors.runs_distinct(column=self.column)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(**{self.column: "" if value == SHARED else value})


class TenantFilter(_DistinctFilter):
    title, parameter_name, column = "tenant", "tenant", "tenant_id"


class AgentFilter(_DistinctFilter):
    title, parameter_name, column = "agent", "agent", "agent_name"


class ParentFilter(admin.SimpleListFilter):
    """Top-level runs, sub-agents, or (any other value) the children of that run id."""

    title, parameter_name = "parent", "parent"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("none", "top-level runs"), ("any", "sub-agents")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        if value in ("none", "any"):
            return queryset.filter(parent__isnull=value == "none")
        return queryset.filter(parent_id=value)


class UsageChangeList(ChangeList):
    """Fetches the ledger totals of the page's runs in one query (the tokens and cost columns)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        totals = usage_totals_by_run(run_ids=[r.id for r in self.result_list])
        for run in self.result_list:
            run.console_usage = totals.get(run.id, UsageTotals())


class ForkForm(forms.Form):
    from_step = forms.IntegerField(min_value=0)
    prompt = forms.CharField(required=False, max_length=65536, strip=True)


class BulkCancelForm(forms.Form):
    tenant_id = forms.CharField(required=False, max_length=128, help_text="empty: every tenant")
    agent_name = forms.CharField(required=False, max_length=128, help_text="empty: every agent")
    reason = forms.CharField(required=False, max_length=1024, initial="cancelled from the admin")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for key in ("tenant_id", "agent_name"):
            value = str(data.get(key) or "").strip()
            if value and not IDENT_RE.fullmatch(value):
                self.add_error(key, "must match [A-Za-z0-9_-]{1,128}")
            data[key] = value
        if not data.get("tenant_id") and not data.get("agent_name"):
            raise forms.ValidationError("name a tenant or an agent (or both): to stop everything, pause the runtime")
        return data


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "id",
        "agent_id",
        "tenant",
        "agent_name",
        "status",
        "step",
        "parent_link",
        "created_at",
        "tokens",
        "cost",
    )
    list_filter = (TenantFilter, AgentFilter, "status", ("created_at", admin.DateFieldListFilter), ParentFilter)
    search_fields = ("=id", "=agent_id", "=session_id", "=parent__id", "=user_id")
    list_select_related = ("parent",)
    show_full_result_count = False  # the table is large; no COUNT(*) per page
    list_per_page = 50
    change_list_template = "admin/runs/run/change_list.html"
    actions = ("cancel_selected", "retry_selected")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        return selectors.runs_console()

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return UsageChangeList

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a run changes only through its services: the actions below

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.has_perm("runs.change_run"))

    @admin.display(description="tenant", ordering="tenant_id")
    def tenant(self, run: Run) -> str:
        return run.tenant_id or SHARED

    @admin.display(description="parent")
    def parent_link(self, run: Run) -> str:
        if run.parent_id is None:
            return "-"
        url = reverse("admin:runs_run_change", args=[quote(run.parent_id)])
        return format_html('<a href="{}">{}</a>', url, run.parent_id)

    @admin.display(description="tokens")
    def tokens(self, run: Run) -> int:
        return _usage(run).tokens

    @admin.display(description="cost (USD)")
    def cost(self, run: Run) -> str:
        totals = _usage(run)
        return f"{totals.cost_usd}" + (f" (+{totals.unpriced_calls} unpriced)" if totals.unpriced_calls else "")

    @admin.action(description="Cancel the selected runs (and their sub-agents)", permissions=["operate"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        for run_id in self._bounded(request, queryset):
            self._act(request, run_id, Verb.CANCEL)

    @admin.action(description="Retry the selected failed runs from their last committed step", permissions=["operate"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        for run_id in self._bounded(request, queryset):
            self._act(request, run_id, Verb.RETRY)

    def _bounded(self, request: HttpRequest, queryset: QuerySet[Run]) -> list[str]:
        """The selected run ids, or none (with a message) past BULK_CANCEL_MAX: one request does
        at most that many service calls ("select all" can name every run ever made)."""
        ids = list(queryset.values_list("id", flat=True)[: operations.BULK_CANCEL_MAX + 1])
        if len(ids) > operations.BULK_CANCEL_MAX:
            limit = operations.BULK_CANCEL_MAX
            self.message_user(request, f"at most {limit} runs per action; narrow the selection", messages.ERROR)
            return []
        return ids

    def _act(self, request: HttpRequest, run_id: str, verb: Verb) -> None:
        """Run one action on one run through its service; its outcome (or refusal) becomes a message."""
        who = operator(request)
        try:
            if verb is Verb.CANCEL:
                out = services.run_cancel(principal=who, run_id=run_id, reason=f"cancelled by {who.subject}")
            else:
                out = operations.run_retry(principal=who, run_id=run_id)
        except ApplicationError as exc:
            self.message_user(request, f"{run_id}: {verb} refused: {exc.message} ({exc.code})", messages.ERROR)
            return
        if verb is Verb.CANCEL and not out["cancelled"]:
            self.message_user(request, f"{run_id}: already {out['status']}", messages.INFO)
            return
        self.message_user(request, f"{run_id}: {verb} done", messages.SUCCESS)

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        return [
            path("runtime/", view(self.runtime_view), name="runs_run_runtime"),
            path("bulk-cancel/", view(self.bulk_cancel_view), name="runs_run_bulk_cancel"),
            path("<str:object_id>/cancel/", view(require_POST(self.cancel_view)), name="runs_run_cancel"),
            path("<str:object_id>/retry/", view(require_POST(self.retry_view)), name="runs_run_retry"),
            path("<str:object_id>/fork/", view(require_POST(self.fork_view)), name="runs_run_fork"),
            *super().get_urls(),
        ]

    def _page(self, request: HttpRequest, template: str, title: str, **context: Any) -> TemplateResponse:
        base = {**self.admin_site.each_context(request), "opts": self.model._meta, "title": title}
        return TemplateResponse(request, template, {**base, **context})

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        """The run page: header, parent and children, ledger totals, tool calls, the timeline, live tail."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            run = selectors.run_get(tenant_id=None, run_id=unquote(object_id))
        except ApplicationError:
            messages.warning(request, f"no run with id {object_id[:64]!r}")
            return HttpResponseRedirect(reverse("admin:runs_run_changelist"))
        events = selectors.run_events_all(run_id=run.id, limit=TIMELINE_LIMIT)
        return self._page(
            request,
            "admin/runs/run/run_page.html",
            f"Run {run.id}",
            run=run,
            original=run,
            live=run.status not in TERMINAL,
            failed=run.status == RunStatus.FAILED,
            can_operate=self.has_operate_permission(request),
            children=selectors.run_children(run_id=run.id),
            forks=selectors.run_forks(run_id=run.id),
            tool_calls=selectors.run_tool_calls(run_id=run.id),
            usage=usage_totals_by_run(run_ids=[run.id]).get(run.id, UsageTotals()),
            items=timeline(events),
            truncated=len(events) >= TIMELINE_LIMIT,
            tail_from=events[-1]["seq"] if events else 0,
        )

    def _operate(self, request: HttpRequest, object_id: str, verb: Verb) -> HttpResponse:
        if not self.has_operate_permission(request):
            raise PermissionDenied
        self._act(request, unquote(object_id), verb)
        return HttpResponseRedirect(reverse("admin:runs_run_change", args=[object_id]))

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._operate(request, object_id, Verb.CANCEL)

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._operate(request, object_id, Verb.RETRY)

    def fork_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Requeue from step N: a new run forked from the transcript through step N (apps.runs.fork,
        as `POST /v1/runs/{id}/fork`), in the source's tenant. The fork's page on success; the
        refusal as a message on the source's page otherwise."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        run_id = unquote(object_id)
        back = HttpResponseRedirect(reverse("admin:runs_run_change", args=[object_id]))
        form = ForkForm(request.POST)
        if not form.is_valid():
            problems = "; ".join(f"{name}: {' '.join(map(str, errs))}" for name, errs in form.errors.items())
            self.message_user(request, f"{run_id}: fork refused: {problems}", messages.ERROR)
            return back
        step, prompt = form.cleaned_data["from_step"], form.cleaned_data["prompt"] or None
        try:
            source = selectors.run_get(tenant_id=None, run_id=run_id)
            who = operator(request, tenant_id=source.tenant_id)
            fork = run_fork(principal=who, run_id=run_id, request=ForkRequest(from_step=step, prompt=prompt))
        except ApplicationError as exc:
            self.message_user(request, f"{run_id}: fork refused: {exc.message} ({exc.code})", messages.ERROR)
            return back
        self.message_user(request, f"{run_id}: forked at step {step} as {fork.id}", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:runs_run_change", args=[quote(fork.id)]))

    def runtime_view(self, request: HttpRequest) -> HttpResponse:
        """The runtime's pause switch: GET shows it, POST `op=pause|resume` flips it through the API's services."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            if not self.has_operate_permission(request):
                raise PermissionDenied
            self._runtime_op(request, request.POST.get("op", ""))
            return HttpResponseRedirect(reverse("admin:runs_run_runtime"))
        return self._page(
            request,
            "admin/runs/run/runtime.html",
            "Runtime",
            state=services.runtime_state_get(),
            paused_runs=selectors.paused_runs_count(),
            live=selectors.runs_live_counts(),
            can_operate=self.has_operate_permission(request),
        )

    def _runtime_op(self, request: HttpRequest, op: str) -> None:
        try:
            if op == "pause":  # begun, not waited for: a run inside an iteration parks at its boundary
                out = services.runtime_pause_start()
                left = out["runnable_runs_count"]
                note = f"; {left} run(s) park at their next boundary, then the sweep settles the pause" if left else ""
                self.message_user(request, f"runtime {out['state']}: {out['paused_runs_count']} run(s) paused{note}")
            elif op == "resume":
                out = services.runtime_resume()
                self.message_user(request, f"runtime running: {out['resumed_runs_count']} run(s) resumed")
            else:
                self.message_user(request, f"unknown op {op[:20]!r}: pause or resume", messages.ERROR)
        except ApplicationError as exc:
            self.message_user(request, f"{op} refused: {exc.message} ({exc.code})", messages.ERROR)

    def bulk_cancel_view(self, request: HttpRequest) -> HttpResponse:
        """Cancel every live top-level run of a tenant and/or agent (operations.runs_cancel_matching)."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        form = BulkCancelForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                out = operations.runs_cancel_matching(
                    principal=operator(request),
                    tenant_id=data["tenant_id"] or None,
                    agent_name=data["agent_name"],
                    reason=data["reason"] or f"cancelled by {operator(request).subject}",
                )
            except ApplicationError as exc:
                form.add_error(None, f"{exc.message} ({exc.code})")
            else:
                text = f"{len(out.cancelled)} run(s) cancelled, {len(out.already_done)} had already ended"
                self.message_user(request, text, messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:runs_run_changelist"))
        return self._page(request, "admin/runs/run/bulk_cancel.html", "Cancel live runs by tenant or agent", form=form)


def _usage(run: Run) -> UsageTotals:
    found: UsageTotals = getattr(run, "console_usage", UsageTotals())
    return found
