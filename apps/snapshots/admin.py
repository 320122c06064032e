"""Django admin of stored snapshots: list and read their metadata (never their content, which holds
every run's transcript); delete them only through the service (`snapshot_delete`). Restore stays on
`POST /v1/_snapshots/{id}/restore` and `manage.py snapshot`, where its report is returned."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.core.admin import ReadOnlyAdmin
from apps.snapshots.models import Snapshot
from apps.snapshots.services import snapshot_delete


@admin.register(Snapshot)
class SnapshotAdmin(ReadOnlyAdmin):
    list_display = ("id", "label", "created_at", "byte_size", "schema_version")
    search_fields = ("id", "label")
    ordering = ("-created_at",)
    fields = ("id", "label", "created_at", "byte_size", "schema_version", "checksum")
    actions = ("delete_snapshots",)

    def has_service_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("snapshots.delete_snapshot"))

    @admin.action(description="Delete the selected snapshots (snapshot service)", permissions=["service"])
    def delete_snapshots(self, request: HttpRequest, queryset: QuerySet[Snapshot]) -> None:
        ids = list(queryset.values_list("id", flat=True))
        for snapshot_id in ids:
            snapshot_delete(snapshot_id=snapshot_id)
        self.message_user(request, f"deleted {len(ids)} snapshot(s)")
