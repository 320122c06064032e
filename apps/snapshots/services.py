"""Capture, restore and delete snapshots (SPEC 2.4, 4.6).

Invariants:
- Every section is read in one REPEATABLE READ, READ ONLY transaction: one
  consistent picture of definitions, memory, channels and evaluations, even
  while runs move.
- Runs are carried only by a capture of the `paused` runtime (as loomcycle:
  only paused runs), and then every parked run, with no run queued or running
  (409 `runs_not_parked`, after a pause that timed out). A capture of a
  running (or pausing) runtime carries no run and says how many live runs it
  left out (`Capture.runs_left_out`): a live run's rows move between reads of
  different runs, and a parked one may wait on one that moves.
- A capture never holds more than `max_bytes` of envelope (413
  `snapshot_too_large` as soon as a section passes it); it is stored once,
  under a fresh id, and never changed.
- A restore verifies the whole envelope (format, versions, checksum) before
  it writes, then writes every section in ONE transaction: all or nothing.
  Every row is insert-or-ignore, so a second restore of the same envelope
  writes nothing and its counters are all zero.
- Each app writes its own tables (apps/<app>/snapshot.py; run rows through
  apps.runs.store): this module only orders the sections and sums counters.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import DataError, IntegrityError, connection, transaction

from apps.channels import snapshot as channels_snapshot
from apps.evaluations import snapshot as evaluations_snapshot
from apps.memory import snapshot as memory_snapshot
from apps.runs import snapshot as runs_snapshot
from apps.runs.models import RuntimeStateValue
from apps.runs.selectors import live_runs_count, runnable_runs_count, runtime_state
from apps.snapshots import envelope as env
from apps.snapshots.errors import (
    RunsNotParked,
    SnapshotIdConflict,
    SnapshotInvalid,
    SnapshotNotFound,
    SnapshotTooLarge,
)
from apps.snapshots.models import Snapshot
from apps.snapshots.selectors import snapshot_content
from apps.substrate import snapshot as substrate_snapshot


def new_snapshot_id(now: datetime) -> str:
    return f"snap_{int(now.timestamp() * 1000)}_{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Capture:
    """A stored snapshot and what it carries of the runs alive when it was read."""

    row: Snapshot
    runtime_state: str  # running | pausing | paused, as read by the capture
    runs_captured: int
    runs_left_out: int  # runs alive at the capture that the snapshot does not carry


@dataclass(frozen=True)
class _Read:
    sections: str
    runtime_state: str
    runs_captured: int
    runs_left_out: int


def _sections(runs: list[dict[str, Any]]) -> Iterator[tuple[str, Any]]:
    """Every section's rows, read one at a time (the caller bounds the total)."""
    yield "agent_defs", substrate_snapshot.agent_defs_export()
    yield "agent_def_active", substrate_snapshot.agent_def_active_export()
    yield "memory", memory_snapshot.memory_export()
    yield "channels", channels_snapshot.channels_export(run_ids=[e["run"]["id"] for e in runs])
    yield "paused_runs", runs
    yield "evaluations", evaluations_snapshot.evaluations_export()


def _picture(max_bytes: int) -> _Read:
    """In the capture's picture of the database: the paused runtime with its parked runs (none
    runnable: a pause that timed out leaves some moving), or a live one without runs."""
    state = runtime_state()
    if state != RuntimeStateValue.PAUSED:
        left_out = live_runs_count()
        return _Read(env.sections_text(_sections([]), max_bytes=max_bytes), state, 0, left_out)
    if moving := runnable_runs_count():
        raise RunsNotParked(
            f"{moving} run(s) are still queued or running (the pause timed out?); capture once they park",
            details={"runnable_runs": moving},
        )
    runs = runs_snapshot.paused_runs_export()
    return _Read(env.sections_text(_sections(runs), max_bytes=max_bytes), state, len(runs), 0)


def _read_sections(max_bytes: int) -> _Read:
    if connection.in_atomic_block:  # inside a caller's transaction (a test's): that one's picture
        return _picture(max_bytes)
    with transaction.atomic():
        with connection.cursor() as cur:  # the transaction's first statement: one snapshot of the database
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        return _picture(max_bytes)


def snapshot_capture(*, label: str = "", max_bytes: int | None = None) -> Snapshot:
    """snapshot_take's stored row."""
    return snapshot_take(label=label, max_bytes=max_bytes).row


def snapshot_take(*, label: str = "", max_bytes: int | None = None) -> Capture:
    """Capture the runtime into a stored snapshot; `max_bytes` may only lower the configured cap."""
    cap = min(max_bytes or settings.LOOMCYCLE.snapshot_max_bytes, settings.LOOMCYCLE.snapshot_max_bytes)
    now = datetime.fromtimestamp(time.time(), tz=UTC)
    snapshot_id = new_snapshot_id(now)
    read = _read_sections(cap)
    header = {"id": snapshot_id, "created_at": now.isoformat(), "label": label, "schema_version": env.SCHEMA_VERSION}
    text = env.envelope_text(header, read.sections)
    if len(text.encode()) > cap:  # the header's few hundred bytes on top of the sections
        raise SnapshotTooLarge(f"snapshot passes {cap} bytes", details={"max_bytes": cap})
    try:
        with transaction.atomic():  # a savepoint inside a caller's transaction: the conflict is reported, not fatal
            row = Snapshot.objects.create(
                id=snapshot_id,
                created_at=now,
                label=label,
                schema_version=env.SCHEMA_VERSION,
                byte_size=len(text.encode()),
                checksum=env.checksum_of(read.sections),
                content=text,
            )
    except IntegrityError as exc:
        raise SnapshotIdConflict(f"snapshot id {snapshot_id} already exists; capture again") from exc
    return Capture(row, read.runtime_state, read.runs_captured, read.runs_left_out)


def _restore_rows(rows: dict[str, Any]) -> dict[str, int]:
    """Inside one transaction: every section in dependency order; the rows written."""
    defs = substrate_snapshot.agent_defs_restore(
        defs=_list(rows, "agent_defs"), pointers=_list(rows, "agent_def_active")
    )
    memory = memory_snapshot.memory_restore(_list(rows, "memory"))
    channels_section = rows.get("channels", {})
    if not isinstance(channels_section, dict):
        raise SnapshotInvalid("section channels must hold an object")
    channels = channels_snapshot.channels_restore(channels_section)
    runs = runs_snapshot.paused_runs_restore(_list(rows, "paused_runs"), def_ids=defs.def_ids)
    waits = channels_snapshot.channel_waits_restore(channels_section, run_tenants=runs.run_tenants)
    return {
        "agent_defs_restored": defs.agent_defs_restored,
        "agent_def_active_restored": defs.agent_def_active_restored,
        "memory_restored": memory,
        "channel_defs_restored": channels.channel_defs_restored,
        "channel_messages_restored": channels.channel_messages_restored,
        "channel_cursors_restored": channels.channel_cursors_restored,
        "channel_waits_restored": waits,
        "evaluations_restored": evaluations_snapshot.evaluations_restore(
            _list(rows, "evaluations"), def_ids=defs.def_ids
        ),
        "paused_runs_restored": runs.paused_runs_restored,
        "paused_runs_resumed": runs.paused_runs_resumed,
        "transcript_events_restored": runs.transcript_events_restored,
        "transcript_entries_restored": runs.transcript_entries_restored,
        "run_inputs_restored": runs.run_inputs_restored,
        "tool_calls_restored": runs.tool_calls_restored,
        "interrupts_restored": runs.interrupts_restored,
    }


def _list(rows: dict[str, Any], name: str) -> list[Any]:
    value = rows.get(name, [])
    if not isinstance(value, list):
        raise SnapshotInvalid(f"section {name} must hold a list")
    return value


def snapshot_restore(*, envelope: Any) -> dict[str, int]:
    """Verify `envelope`, then write it in one transaction; counters of rows actually written."""
    rows = env.envelope_verify(envelope)
    try:
        with transaction.atomic():
            return _restore_rows(rows)
    except (IntegrityError, DataError) as exc:  # a row the schema refuses (a broken reference, a bad value)
        raise SnapshotInvalid(f"a snapshot row was refused by the database: {exc}".splitlines()[0]) from exc


def snapshot_restore_stored(*, snapshot_id: str) -> dict[str, int]:
    """Restore a snapshot stored on this instance."""
    return snapshot_restore(envelope=json.loads(snapshot_content(snapshot_id=snapshot_id)))


def snapshot_delete(*, snapshot_id: str) -> None:
    if not Snapshot.objects.filter(id=snapshot_id).delete()[0]:
        raise SnapshotNotFound(f"snapshot {snapshot_id} not found")
