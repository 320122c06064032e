"""The snapshot error codes (SPEC 2.13)."""

from __future__ import annotations

from apps.core.errors import Conflict, Invalid, NotFound, PayloadTooLarge, Unprocessable


class SnapshotNotFound(NotFound):
    code = "snapshot_not_found"


class SnapshotIdConflict(Conflict):
    code = "snapshot_id_conflict"


class RunsNotParked(Conflict):
    code = "runs_not_parked"


class SnapshotTooLarge(PayloadTooLarge):
    code = "snapshot_too_large"


class SnapshotVersionTooNew(Unprocessable):
    code = "snapshot_version_too_new"


class SnapshotVersionUnknown(Unprocessable):
    code = "snapshot_version_unknown"


class SnapshotChecksumMismatch(Unprocessable):
    code = "snapshot_checksum_mismatch"


class SnapshotInvalid(Invalid):
    code = "snapshot_invalid"
