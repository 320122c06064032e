"""The Django admin's interruptions: every interrupt, read-only (the row is the service's), and for a pending one an
"answer" form that goes through the same service as the REST resolve
(apps.runs.interrupts.services.interrupt_resolve), attributed `admin:<username>`. Registered from
RunsConfig.ready()."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from apps.core.admin import ReadOnlyAdmin
from apps.core.errors import ApplicationError
from apps.runs.interrupts import services as interrupts
from apps.runs.models import Interrupt, InterruptStatus
from apps.substrate.admin.common import admin_subject, form_page, pretty_json


class AnswerForm(forms.Form):
    """Answer (one of the options, when the ask gave some) or decline with a note."""

    disposition = forms.ChoiceField(
        choices=[("answer", "answer"), ("declined", "decline")], initial="answer", widget=forms.RadioSelect
    )
    answer = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}), help_text="a decline's reason")

    def __init__(self, *args: Any, interrupt: Interrupt, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["answer"].help_text = interrupt.question
        if interrupt.options:
            choices = [("", "---"), *((o, o) for o in interrupt.options)]
            self.fields["answer"] = forms.ChoiceField(choices=choices, required=False, help_text=interrupt.question)

    def reply(self, resolved_by: str) -> interrupts.Resolve:
        data = self.cleaned_data
        answer = data.get("answer") or None
        return interrupts.Resolve(
            answer=answer, disposition=data["disposition"], resolved_by=resolved_by, note=data.get("note") or ""
        )


@admin.register(Interrupt)
class InterruptAdmin(ReadOnlyAdmin):
    list_display = ("id", "status", "priority", "question_short", "run_id", "user_id", "tenant_id", "expires_at")
    list_filter = ("status", "priority")
    search_fields = ("id", "run__id", "user_id", "agent_id")
    ordering = ("-created_at",)
    readonly_fields = ("context_pretty",)
    exclude = ("context_data",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Interrupt]:
        return super().get_queryset(request).select_related("run")

    @admin.display(description="question")
    def question_short(self, obj: Interrupt) -> str:
        if obj.status != InterruptStatus.PENDING:
            return obj.question[:80]
        url = reverse("admin:runs_interrupt_answer", args=[quote(obj.pk)])
        return format_html('{} <a href="{}">answer</a>', obj.question[:80], url)

    @admin.display(description="context")
    def context_pretty(self, obj: Interrupt) -> str:
        return pretty_json(obj.context_data)

    def get_urls(self) -> list[URLPattern]:
        answer = self.admin_site.admin_view(self.answer_view)
        return [path("<path:object_id>/answer/", answer, name="runs_interrupt_answer"), *super().get_urls()]

    def answer_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not request.user.has_perm("runs.change_interrupt"):
            raise PermissionDenied
        row = get_object_or_404(Interrupt, pk=unquote(object_id))
        form = AnswerForm(request.POST or None, interrupt=row)
        if request.method == "POST" and form.is_valid():
            try:
                interrupts.interrupt_resolve(
                    tenant_id=None,
                    owner=None,
                    run_id=row.run_id,
                    interrupt_id=row.id,
                    reply=form.reply(admin_subject(request)),
                )
            except ApplicationError as exc:
                form.add_error(None, f"{exc.code}: {exc.message}")
            else:
                self.message_user(request, f"interrupt {row.id} answered", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:runs_interrupt_changelist"))
        return form_page(self, request, form, title=f"Answer {row.id}", submit="Send")
