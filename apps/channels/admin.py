"""Channel messages, cursors and parked waits in the admin: read-only views
(messages are published through the API or the Channel tool, so cursors and
waits stay consistent with them)."""

from __future__ import annotations

from django.contrib import admin

from apps.channels.models import ChannelCursor, ChannelMessage, ChannelWait
from apps.core.admin import ReadOnlyAdmin


@admin.register(ChannelMessage)
class ChannelMessageAdmin(ReadOnlyAdmin):
    list_display = ("id", "channel", "scope", "scope_id", "tenant_id", "visible_at", "expires_at", "published_by")
    list_filter = ("scope",)
    search_fields = ("id", "channel", "scope_id", "published_by")


@admin.register(ChannelCursor)
class ChannelCursorAdmin(ReadOnlyAdmin):
    list_display = ("channel", "scope", "scope_id", "tenant_id", "cursor", "updated_at")
    search_fields = ("channel", "scope_id")


@admin.register(ChannelWait)
class ChannelWaitAdmin(ReadOnlyAdmin):
    list_display = ("run", "call_id", "op", "tenant_id", "deadline", "wake_at", "created_at")
    list_filter = ("op",)
    search_fields = ("run__id", "call_id")
