"""Channels' part of a snapshot (apps.snapshots, SPEC 4.6 `channels`): the
runtime channel declarations, every message, every stream cursor, and the
parked subscribe/await rows (`ChannelWait`) of the runs the snapshot carries.

A restore is insert-or-ignore throughout: a message by its id (and its
idempotency key), a cursor by its stream, a declaration by (tenant, name), a
wait by (run, call_id); what this instance already has wins. A restored wait
is due at once: beat re-checks it against the restored messages. A runtime
declaration whose name this instance declares in yaml is skipped (yaml
channels cannot be redeclared at runtime, apps.substrate.channeldefs). Waits are
restored after their runs (their foreign key), and only for runs the restore
wrote, so a second restore writes none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from apps.channels.models import ChannelCursor, ChannelMessage, ChannelWait
from apps.core.errors import Invalid
from apps.core.rows import row_dump, rows_insert_or_ignore
from apps.substrate import channeldefs
from apps.substrate.models import ChannelDef, DefSource


@dataclass(frozen=True)
class ChannelsRestored:
    channel_defs_restored: int
    channel_messages_restored: int
    channel_cursors_restored: int


def channels_export(*, run_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Declarations, messages, cursors, and the waits of `run_ids`; no instance-local keys."""
    defs = ChannelDef.objects.filter(source=DefSource.RUNTIME).order_by("tenant_id", "name")
    waits = ChannelWait.objects.filter(run_id__in=run_ids).order_by("run_id", "call_id")
    return {
        "defs": [row_dump(row, exclude=("id",)) for row in defs.iterator()],
        "messages": [row_dump(row) for row in ChannelMessage.objects.order_by("visible_at", "id").iterator()],
        "cursors": [row_dump(row, exclude=("id",)) for row in ChannelCursor.objects.order_by("id").iterator()],
        "waits": [row_dump(row, exclude=("id",)) for row in waits.iterator()],
    }


def _rows(section: dict[str, Any], key: str) -> list[dict[str, Any]]:
    rows = section.get(key, [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise Invalid(f"channels.{key} must be a list of objects", code="snapshot_invalid")
    return rows


def channels_restore(section: dict[str, Any]) -> ChannelsRestored:
    """Inside the restore's transaction: declarations, messages and cursors (not waits)."""
    return ChannelsRestored(
        channel_defs_restored=channeldefs.channeldefs_restore(_rows(section, "defs")),
        channel_messages_restored=rows_insert_or_ignore(ChannelMessage, _rows(section, "messages")),
        channel_cursors_restored=rows_insert_or_ignore(ChannelCursor, _rows(section, "cursors")),
    )


def channel_waits_restore(section: dict[str, Any], *, run_tenants: dict[str, str]) -> int:
    """Inside the restore's transaction, after the runs: the waits of the runs it wrote
    (`run_tenants`: run id -> its tenant), each in its run's tenant, due at once, so
    beat's next wake tick checks each against the restored messages (a message that
    satisfies a wait is not lost between capture and restore; a wait still unsatisfied
    goes back to its own wake time, apps.channels.waits). A wait on a stream whose
    channel its tenant cannot see (its own or a shared declaration) is refused (400)."""
    now = timezone.now().isoformat()
    waits = []
    for wait in _rows(section, "waits"):
        tenant = run_tenants.get(str(wait.get("run_id")))
        if tenant is None:
            continue
        _check_streams(wait, tenant)
        waits.append({**wait, "tenant_id": tenant, "wake_at": now})
    return rows_insert_or_ignore(ChannelWait, waits)


def _check_streams(wait: dict[str, Any], tenant_id: str) -> None:
    """Every stream of `wait` names a channel declared for `tenant_id` or shared (after the
    declarations were restored)."""
    streams = wait.get("streams")
    if not isinstance(streams, list) or not all(isinstance(s, str) for s in streams):
        raise Invalid(f"run {wait.get('run_id')}: a channel wait's streams must be strings", code="snapshot_invalid")
    names = {s.split("\x1f", 1)[0] for s in streams}
    known = set(ChannelDef.objects.filter(name__in=names, tenant_id__in={tenant_id, ""}).values_list("name", flat=True))
    if missing := sorted(names - known):
        raise Invalid(
            f"run {wait.get('run_id')} waits on channels {missing}, not channels of tenant {tenant_id!r}",
            code="snapshot_invalid",
            details={"run_id": wait.get("run_id"), "channels": missing},
        )
