"""ChannelDef's one writer (SPEC 9.4): the runtime channel declarations a tenant creates,
changes and deletes (REST /v1/_channels, through apps.channels.services), and the restore of
a snapshot's runtime declarations (apps.channels.snapshot). The shared tenant's yaml block is
written by this app too, at boot (config.channel_defs_sync_yaml). apps.channels owns a
channel's messages and cursors and reads declarations through its selectors; it never writes
this table.

Invariants:
- a yaml channel is immutable at runtime: its name cannot be redeclared, and it cannot be
  changed or deleted over the runtime API (409 channel_yaml_immutable);
- one runtime channel per (tenant, name) (409 channel_name_in_use), counted against
  LOOMCYCLE_TENANT_MAX_CHANNELS in the transaction that inserts it;
- a restored declaration never replaces a row this instance has, nor a yaml channel's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from apps.core.errors import Conflict, Invalid, NotFound
from apps.core.quotas import tenant_count_check, tenant_count_lock
from apps.core.rows import rows_insert_or_ignore
from apps.substrate.models import ChannelDef, DefSource


class ChannelNotFound(NotFound):
    code = "channel_not_found"


class ChannelYamlImmutable(Conflict):
    code = "channel_yaml_immutable"


class ChannelNameInUse(Conflict):
    code = "channel_name_in_use"


@dataclass(frozen=True)
class ChannelSpec:
    description: str = ""
    scope: str = "global"
    semantic: str = "queue"
    default_ttl: int | None = None
    max_messages: int | None = None
    publisher: str = ""
    period: str = ""


def channeldef_create(*, tenant_id: str, name: str, spec: ChannelSpec) -> ChannelDef:
    if len(spec.publisher) > 32 or len(spec.period) > 64:
        raise Invalid("publisher is at most 32 characters, period at most 64", code="invalid_body")
    with transaction.atomic():
        existing = ChannelDef.objects.select_for_update().filter(name=name, tenant_id__in={tenant_id, ""})
        for row in existing:
            if row.source == DefSource.YAML:
                raise ChannelYamlImmutable(f'channel "{name}" is declared in yaml; it cannot be redeclared at runtime')
            if row.tenant_id == tenant_id:
                raise ChannelNameInUse(f'channel "{name}" already exists')
        tenant_count_lock("channels", tenant_id)  # the count and the insert are one decision
        tenant_count_check(
            resource="channels",
            tenant_id=tenant_id,
            held=ChannelDef.objects.filter(tenant_id=tenant_id, source=DefSource.RUNTIME).count(),
            cap=settings.LOOMCYCLE.tenant_max_channels,
            setting="LOOMCYCLE_TENANT_MAX_CHANNELS",
        )
        return ChannelDef.objects.create(
            tenant_id=tenant_id,
            name=name,
            source=DefSource.RUNTIME,
            description=spec.description,
            scope=spec.scope,
            semantic=spec.semantic,
            default_ttl_seconds=spec.default_ttl or None,
            max_messages=spec.max_messages or None,
            publisher=spec.publisher,
            period=spec.period,
        )


def channeldef_runtime(*, tenant_id: str, name: str) -> ChannelDef:
    """The tenant's own runtime channel `name` (what PATCH and DELETE may change)."""
    rows = list(ChannelDef.objects.filter(name=name, tenant_id__in={tenant_id, ""}))
    if any(r.source == DefSource.YAML for r in rows):
        raise ChannelYamlImmutable(f'channel "{name}" is declared in yaml; change the yaml instead')
    for row in rows:
        if row.tenant_id == tenant_id:
            return row
    raise ChannelNotFound(f'channel "{name}" not found')


def channeldef_update(*, tenant_id: str, name: str, changes: dict[str, Any]) -> ChannelDef:
    """PATCH: description, semantic, default_ttl, max_messages of a runtime channel (0 = none)."""
    row = channeldef_runtime(tenant_id=tenant_id, name=name)
    if changes.get("description") is not None:
        row.description = changes["description"]
    if changes.get("semantic") is not None:
        row.semantic = changes["semantic"]
    if changes.get("default_ttl") is not None:
        row.default_ttl_seconds = changes["default_ttl"] or None
    if changes.get("max_messages") is not None:
        row.max_messages = changes["max_messages"] or None
    row.save()
    return row


def channeldef_delete(row: ChannelDef) -> None:
    """Delete a runtime declaration (`channeldef_runtime`), in the caller's transaction, which
    deletes the channel's messages and cursors with it (apps.channels.services.channel_delete)."""
    row.delete()


def channeldefs_restore(rows: list[dict[str, Any]]) -> int:
    """A snapshot's runtime declarations, insert-or-ignore by (tenant, name), inside the
    restore's transaction; one whose name this instance declares in yaml is skipped."""
    yaml_names = set(ChannelDef.objects.filter(source=DefSource.YAML).values_list("name", flat=True))
    return rows_insert_or_ignore(ChannelDef, [r for r in rows if r.get("name") not in yaml_names])
