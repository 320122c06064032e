"""Request and response bodies of /v1/_snapshots (SPEC 2.4)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_NO_HISTORY = "interaction history is not part of this build's snapshots: only false / null"


class SnapshotCaptureIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str = Field(default="", max_length=256)
    # loomcycle's interaction history section is not built here: only false (or absent) is accepted.
    include_history: Literal[False] = Field(default=False, description=_NO_HISTORY)
    include_history_since: None = Field(default=None, description=_NO_HISTORY)
    max_bytes: int | None = Field(default=None, ge=1024, description="at most LOOMCYCLE_SNAPSHOT_MAX_BYTES")


class SnapshotRestoreIn(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    include_history: Literal[False] = Field(default=False, description=_NO_HISTORY)
    envelope: dict[str, Any] | None = Field(
        default=None, alias="json", description="an exported envelope to restore instead of the stored one"
    )


class SnapshotOut(BaseModel):
    id: str
    created_at: str
    label: str
    schema_version: str
    byte_size: int


class SnapshotCapturedOut(SnapshotOut):
    """The capture's answer: the row, and what it carries of the runs alive at that instant."""

    runtime_state: str = Field(description="running | pausing | paused, as the capture read it")
    runs_captured: int = Field(description="parked runs carried (only a capture of the paused runtime carries runs)")
    runs_left_out: int = Field(description="runs alive at the capture that the snapshot does not carry")


class SnapshotListOut(BaseModel):
    entries: list[SnapshotOut]


class SnapshotRestoreOut(BaseModel):
    agent_defs_restored: int
    agent_def_active_restored: int
    memory_restored: int
    channel_defs_restored: int
    channel_messages_restored: int
    channel_cursors_restored: int
    channel_waits_restored: int
    evaluations_restored: int
    paused_runs_restored: int
    paused_runs_resumed: int
    transcript_events_restored: int
    transcript_entries_restored: int
    run_inputs_restored: int
    tool_calls_restored: int
    interrupts_restored: int


class SnapshotSectionOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    version: str
    rows: Any


class SnapshotEnvelopeOut(BaseModel):
    """The stored envelope (apps/snapshots/envelope.py): `checksum` is SHA-256 over the canonical
    JSON of `sections`; restore takes it back as it is."""

    model_config = ConfigDict(extra="allow")

    checksum: str
    created_at: str
    format: str  # "loomcycle-snapshot"
    id: str
    label: str
    schema_version: str
    sections: dict[str, SnapshotSectionOut]


class SnapshotWithEnvelopeOut(SnapshotOut):
    envelope: SnapshotEnvelopeOut
