"""The mirror's file primitives: atomic replace, append-only ndjson keyed by `seq`.

Invariants:
- A `status` file is never seen half-written: it is written to a temporary file in the
  same directory and renamed over the old one.
- An ndjson file only grows by whole lines. A line cut short by a crash (no trailing
  newline) is dropped when the file is next opened for appending (`repair_tail`), so the
  last complete line's `seq` is where the mirror resumes.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

TAIL_CHUNK = 65_536  # bytes read back at a time from the end of a file to find its last line


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` (temp file + fsync + rename); unchanged content is not rewritten."""
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, value: Any) -> None:
    write_atomic(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


def dumps_line(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n"


def append_lines(path: Path, lines: Iterable[str]) -> None:
    """Append whole lines in one write, flushed to disk."""
    data = "".join(lines)
    if not data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())


def _line_start(f: BinaryIO, end: int) -> int:
    """The offset just past the last newline before `end` (0 when there is none), read back
    TAIL_CHUNK bytes at a time: a line may be longer than one chunk."""
    pos = end
    while pos > 0:
        start = max(0, pos - TAIL_CHUNK)
        f.seek(start)
        cut = f.read(pos - start).rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        pos = start
    return 0


def repair_tail(path: Path) -> None:
    """Cut a trailing partial line (a crash mid-append) off `path`, and nothing before it."""
    if not path.exists():
        return
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.truncate(_line_start(f, size))


def last_line(path: Path) -> dict[str, Any] | None:
    """The last complete ndjson line of `path`, parsed (None for a missing or empty file)."""
    repair_tail(path)
    if not path.exists():
        return None
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None
        start = _line_start(f, size - 1)  # the line before the file's final newline
        f.seek(start)
        line = f.read(size - start)
    value = json.loads(line)
    return value if isinstance(value, dict) else None


def last_seq(path: Path) -> int:
    """The `seq` of the last line of `path`; 0 when it has none."""
    line = last_line(path)
    return int(line["seq"]) if line and isinstance(line.get("seq"), int) else 0


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of an ndjson file (used once per log file per mirror process)."""
    repair_tail(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
