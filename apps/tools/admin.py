"""Dynamic volumes in the admin: a read-only view (they are made and removed through
`POST /v1/_volumedef`, which also makes and removes their directories)."""

from __future__ import annotations

from django.contrib import admin

from apps.core.admin import ReadOnlyAdmin
from apps.tools.models import VolumeDef


@admin.register(VolumeDef)
class VolumeDefAdmin(ReadOnlyAdmin):
    list_display = ("tenant_id", "name", "mode", "path", "created_at")
    list_filter = ("mode",)
    search_fields = ("tenant_id", "name")
