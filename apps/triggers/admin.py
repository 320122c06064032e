"""Django admin of the triggers' rows: each schedule's next fire, its last run
(linked to the run's API page; the runs app has no admin pages) and its fire
history; the on_complete jobs. Read-only: schedules are changed through
their definitions and the /v1/_schedules routes."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from apps.core.admin import ReadOnlyAdmin
from apps.triggers.hooks import admin as hooks_admin
from apps.triggers.models import OnCompleteJob, ScheduleFire, ScheduleState
from apps.triggers.webhooks import admin as webhooks_admin

HISTORY_ROWS = 20
__all__ = ["hooks_admin", "webhooks_admin"]  # the hooks' and webhooks' admin pages register on import


def _run_link(run_id: str) -> SafeString | str:
    return format_html('<a href="/v1/runs/{}">{}</a>', run_id, run_id) if run_id else "-"


@admin.register(ScheduleState)
class ScheduleStateAdmin(ReadOnlyAdmin):
    list_display = ("name", "tenant_id", "next_run_at", "last_run", "last_status", "fire_count", "paused_until")
    list_filter = ("tenant_id", "last_status")
    search_fields = ("name", "schedule_def__id")
    ordering = ("next_run_at",)
    readonly_fields = ("last_run", "fire_history")

    @admin.display(description="last run")
    def last_run(self, obj: ScheduleState) -> SafeString | str:
        return _run_link(obj.last_run_id)

    @admin.display(description=f"fire history (newest {HISTORY_ROWS})")
    def fire_history(self, obj: ScheduleState) -> SafeString:
        fires = ScheduleFire.objects.filter(schedule_def_id=obj.schedule_def_id).order_by("-fire_time")
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (f.fire_time, f.outcome, _run_link(f.run_id), f.run_status or "-", f.error or "")
                for f in fires[:HISTORY_ROWS]
            ),
        )
        everything = (
            reverse("admin:triggers_schedulefire_changelist") + f"?schedule_def__id__exact={obj.schedule_def_id}"
        )
        return format_html(
            "<table><tr><th>fire time</th><th>outcome</th><th>run</th><th>run status</th><th>error</th></tr>{}</table>"
            '<a href="{}">all fires</a>',
            rows,
            everything,
        )


@admin.register(ScheduleFire)
class ScheduleFireAdmin(ReadOnlyAdmin):
    list_display = ("schedule_name", "tenant_id", "fire_time", "outcome", "run", "run_status", "counted", "error")
    list_filter = ("outcome", "run_status", "tenant_id")
    search_fields = ("schedule_name", "run_id")
    date_hierarchy = "fire_time"

    @admin.display(description="run")
    def run(self, obj: ScheduleFire) -> SafeString | str:
        return _run_link(obj.run_id)


@admin.register(OnCompleteJob)
class OnCompleteJobAdmin(ReadOnlyAdmin):
    list_display = ("run_id", "tenant_id", "state", "run_status", "created_at", "finished_at")
    list_filter = ("state", "run_status")
    search_fields = ("run_id",)
