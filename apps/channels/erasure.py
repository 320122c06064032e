"""Channels' part in a person's erasure (apps.lifecycle.erasure calls these): the messages they
published (`published_by_user_id`, index `chanmsg_publisher`), the messages of their `user`-scoped
streams and those streams' cursors. Bounded: at most `limit` rows per call, in the caller's
transaction. What others published ABOUT them in shared streams is not theirs by key."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from apps.channels.models import ChannelCursor, ChannelMessage

USER_SCOPE = "user"


def _messages(tenant_id: str, user_id: str) -> QuerySet[ChannelMessage]:
    mine = Q(published_by_user_id=user_id) | Q(scope=USER_SCOPE, scope_id=user_id)
    return ChannelMessage.objects.filter(mine, tenant_id=tenant_id)


def _cursors(tenant_id: str, user_id: str) -> QuerySet[ChannelCursor]:
    return ChannelCursor.objects.filter(tenant_id=tenant_id, scope=USER_SCOPE, scope_id=user_id)


def channels_user_count(*, tenant_id: str, user_id: str) -> dict[str, int]:
    return {
        "channels.ChannelMessage": _messages(tenant_id, user_id).count(),
        "channels.ChannelCursor": _cursors(tenant_id, user_id).count(),
    }


def channels_user_erase_batch(*, tenant_id: str, user_id: str, limit: int) -> int:
    """Delete up to `limit` of the person's messages, then their cursors; rows deleted (0: none left)."""
    ids = list(_messages(tenant_id, user_id).values_list("pk", flat=True)[:limit])
    if ids:
        deleted, _ = ChannelMessage.objects.filter(pk__in=ids).delete()
        return deleted
    cursors = list(_cursors(tenant_id, user_id).values_list("pk", flat=True)[:limit])
    deleted, _ = ChannelCursor.objects.filter(pk__in=cursors).delete()
    return deleted
