"""The snapshot envelope: its layout, its checksum and its version checks.

```
{"checksum": "sha256:<hex>", "created_at": "...", "format": "loomcycle-snapshot",
 "id": "snap_...", "label": "...", "schema_version": "1.0",
 "sections": {"<name>": {"version": "1.0", "rows": ...}, ...}}
```

The checksum is SHA-256 over the canonical JSON of `sections` (keys sorted,
no whitespace, UTF-8): a reader recomputes it from what it parsed, so any
edit of a row, a section or a version shows. It guards against corruption
and careless edits, not against an attacker (who can recompute it): restore
is an admin operation, and its input is trusted as far as the admin is.

Versions are "MAJOR.MINOR". A reader refuses a section (or schema) whose
version is newer than its own, or that it cannot parse, before it writes
anything (422 `snapshot_version_too_new` / `snapshot_version_unknown`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterator
from typing import Any

from apps.snapshots.errors import (
    SnapshotChecksumMismatch,
    SnapshotInvalid,
    SnapshotTooLarge,
    SnapshotVersionTooNew,
    SnapshotVersionUnknown,
)

FORMAT = "loomcycle-snapshot"
SCHEMA_VERSION = "1.0"
# The sections this build writes and reads, in restore order, with their versions.
SECTIONS: dict[str, str] = {
    "agent_defs": "1.0",
    "agent_def_active": "1.0",
    "memory": "1.0",
    "channels": "1.0",
    "paused_runs": "1.1",  # 1.1: each run carries its interrupts
    "evaluations": "1.0",
}
_VERSION = re.compile(r"(\d{1,6})\.(\d{1,6})")


def canonical(value: Any) -> str:
    """The one serialisation the checksum is computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def checksum_of(sections_text: str) -> str:
    return "sha256:" + hashlib.sha256(sections_text.encode()).hexdigest()


def sections_text(parts: Iterator[tuple[str, Any]], *, max_bytes: int) -> str:
    """`canonical({name: {"version", "rows"}})` built one section at a time,
    refusing (413) as soon as the text passes `max_bytes`."""
    pieces: list[tuple[str, str]] = []
    size = 2
    for name, rows in parts:
        piece = f"{json.dumps(name)}:{canonical({'rows': rows, 'version': SECTIONS[name]})}"
        size += len(piece.encode()) + 1
        if size > max_bytes:
            raise SnapshotTooLarge(
                f"snapshot passes {max_bytes} bytes at section {name!r}", details={"max_bytes": max_bytes}
            )
        pieces.append((name, piece))
    return "{" + ",".join(piece for _, piece in sorted(pieces)) + "}"  # canonical: keys sorted


def envelope_text(header: dict[str, Any], sections: str) -> str:
    """The stored envelope: the header's canonical JSON with `sections` spliced in."""
    head = canonical({**header, "checksum": checksum_of(sections), "format": FORMAT})
    return head[:-1] + ',"sections":' + sections + "}"


def _version(value: Any, what: str, supported: str) -> None:
    """Refuse an unparseable version, or one newer than `supported`."""
    match = _VERSION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise SnapshotVersionUnknown(f"{what}: version {value!r} is not MAJOR.MINOR", details={"section": what})
    mine = _VERSION.fullmatch(supported)
    assert mine is not None  # our own constants
    if (int(match[1]), int(match[2])) > (int(mine[1]), int(mine[2])):
        raise SnapshotVersionTooNew(
            f"{what}: version {value} is newer than this build reads ({supported})",
            details={"section": what, "version": value, "supported": supported},
        )


def envelope_verify(envelope: Any) -> dict[str, Any]:
    """The envelope's section rows by name, once its format, versions and checksum hold."""
    if not isinstance(envelope, dict) or envelope.get("format") != FORMAT:
        raise SnapshotInvalid(f'not a snapshot envelope (format must be "{FORMAT}")')
    _version(envelope.get("schema_version"), "schema_version", SCHEMA_VERSION)
    sections = envelope.get("sections")
    if not isinstance(sections, dict):
        raise SnapshotInvalid("envelope.sections must be an object")
    for name, section in sections.items():
        if name not in SECTIONS:
            raise SnapshotVersionUnknown(f"unknown section {name!r}", details={"section": name})
        if not isinstance(section, dict) or "rows" not in section:
            raise SnapshotInvalid(f"section {name!r} must be an object with version and rows")
        _version(section.get("version"), name, SECTIONS[name])
    given = envelope.get("checksum")
    if not isinstance(given, str) or not hmac.compare_digest(given, checksum_of(canonical(sections))):
        raise SnapshotChecksumMismatch("the envelope's checksum does not match its sections")
    return {name: section["rows"] for name, section in sections.items()}
