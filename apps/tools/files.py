"""The file tools `Read`, `Write`, `Edit`, `Glob` (SPEC 6.9; Claude Code's input
shapes). Each works inside one bound volume (`volume`, else the run's default
binding, else its sole one) through apps.tools.fs, which keeps every path
inside the volume. Refusals and failures are is_error results."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apps.core.tools import Tool, ToolContext, ToolResult, VolumeBinding
from apps.tools import fs, walk
from apps.tools.volumes import VolumeUnavailable, pick, root_of

READ_CAP = 256 * 1024
WRITE_CAP = 1024 * 1024
GLOB_LIMIT = 100
GLOB_TIMEOUT_S = 5.0  # the whole call: walk and match
GLOB_MAX_SCANNED = 100_000  # files looked at before the listing stops


class Refusal(Exception):
    """An input a file tool refuses; its text is the is_error result."""


def _text(data: dict[str, Any], key: str, *, required: bool = True) -> str:
    """A string field; required ones must be non-empty, except `content` (an empty file is fine)."""
    value = data.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise Refusal(f"{key} must be a string")
    if required and not value and key != "content":
        raise Refusal(f"{key} must be a non-empty string")
    return value


def _fields(data: dict[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise Refusal(f"unknown fields {unknown}")


def run_file_tool(
    ctx: ToolContext, data: dict[str, Any], fields: frozenset[str], body: Callable[[Path, VolumeBinding], str]
) -> ToolResult:
    """Pick the volume, run `body(root, binding)`; every expected failure becomes is_error."""
    try:
        _fields(data, fields)
        binding = pick(ctx, data.get("volume"))
        return ToolResult(body(root_of(ctx, binding), binding))
    except (Refusal, VolumeUnavailable, fs.PathRefused, walk.BudgetExceeded) as exc:
        return ToolResult(str(exc), is_error=True)
    except FileNotFoundError:
        return ToolResult(f"no such file: {data.get('path')}", is_error=True)
    except IsADirectoryError:
        return ToolResult(f"{data.get('path')} is a directory", is_error=True)
    except OSError as exc:  # never str(exc): it names host paths; the model sees the path it gave
        return ToolResult(f"{(exc.strerror or type(exc).__name__).lower()}: {_shown(data)}", is_error=True)


def _shown(data: dict[str, Any]) -> str:
    given = data.get("path", data.get("file_path"))
    return given if isinstance(given, str) and given else "."


def _writable(binding: VolumeBinding) -> None:
    if binding.mode != "rw":
        raise Refusal(f"volume {binding.name!r} is read-only for this run")


# --- Read --------------------------------------------------------------------------

READ_FIELDS = frozenset({"path", "volume", "file_path"})


def _path_arg(data: dict[str, Any]) -> str:
    """`path` (SPEC), or Claude Code's `file_path`."""
    return _text(data, "path") if "path" in data or "file_path" not in data else _text(data, "file_path")


def read_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    def body(root: Path, binding: VolumeBinding) -> str:
        raw, size = fs.read_bytes(fs.locate(root, _path_arg(data)), READ_CAP)
        text = raw.decode("utf-8", errors="replace")
        return text + f"\n[truncated at {READ_CAP} bytes]" if size > READ_CAP else text

    return run_file_tool(ctx, data, READ_FIELDS, body)


# --- Write -------------------------------------------------------------------------

WRITE_FIELDS = frozenset({"path", "content", "volume", "file_path"})


def write_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    def body(root: Path, binding: VolumeBinding) -> str:
        _writable(binding)
        payload = _text(data, "content").encode()
        if len(payload) > WRITE_CAP:
            raise Refusal(f"content is {len(payload)} bytes; the cap is {WRITE_CAP}")
        loc = fs.locate(root, _path_arg(data))
        with _path_lock(loc):
            fs.write_atomic(loc, payload)
        return f"wrote {len(payload)} bytes to {fs.display(loc)}"

    return run_file_tool(ctx, data, WRITE_FIELDS, body)


# --- Edit --------------------------------------------------------------------------

EDIT_FIELDS = frozenset({"path", "old_string", "new_string", "replace_all", "volume", "file_path"})


def _edited(text: str, old: str, new: str, replace_all: bool, shown: str) -> tuple[str, int]:
    """The edited text and its number of replacements. Its size is computed, and refused
    over WRITE_CAP, before it is built: 1 MiB of `a` with a 64 KiB replacement of each is
    a 64 GiB string (`str.count` and `str.replace` agree on non-overlapping matches)."""
    count = text.count(old)
    if count == 0:
        raise Refusal(f"old_string not found in {shown}")
    if count > 1 and not replace_all:
        raise Refusal(
            f"old_string occurs {count} times in {shown}; add surrounding context to make it unique or set replace_all"
        )
    n = count if replace_all else 1
    size = len(text.encode()) + n * (len(new.encode()) - len(old.encode()))
    if size > WRITE_CAP:
        raise Refusal(f"the edited file would be {size} bytes; the cap is {WRITE_CAP}")
    return text.replace(old, new) if replace_all else text.replace(old, new, 1), n


_EDIT_LOCKS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()  # dropped when unused
_EDIT_LOCKS_GUARD = threading.Lock()


def _path_lock(loc: fs.Located) -> threading.Lock:
    """One lock per resolved file in this process: parallel Edits (and Writes) of one
    file in a batch apply one after the other. Across processes the last writer wins."""
    with _EDIT_LOCKS_GUARD:
        lock: threading.Lock | None = _EDIT_LOCKS.get(str(loc.path))
        if lock is None:
            lock = _EDIT_LOCKS[str(loc.path)] = threading.Lock()
        return lock


def edit_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    def body(root: Path, binding: VolumeBinding) -> str:
        _writable(binding)
        old, new = _text(data, "old_string"), _text(data, "new_string", required=False)
        if old == new:
            raise Refusal("old_string and new_string are the same")
        loc = fs.locate(root, _path_arg(data))
        with _path_lock(loc):
            return _edit_locked(loc, old, new, bool(data.get("replace_all")))

    return run_file_tool(ctx, data, EDIT_FIELDS, body)


def _edit_locked(loc: fs.Located, old: str, new: str, replace_all: bool) -> str:
    raw, size = fs.read_bytes(loc, WRITE_CAP + 1)
    if size > WRITE_CAP:
        raise Refusal(f"{fs.display(loc)} is {size} bytes; Edit works on files up to {WRITE_CAP}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal(f"{fs.display(loc)} is not UTF-8 text") from exc
    edited, n = _edited(text, old, new, replace_all, fs.display(loc))
    fs.write_atomic(loc, edited.encode())
    return f"edited {fs.display(loc)} ({n} replacement{'s' if n != 1 else ''})"


# --- Glob --------------------------------------------------------------------------

GLOB_FIELDS = frozenset({"pattern", "path", "volume"})


def glob_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    def body(root: Path, binding: VolumeBinding) -> str:
        try:
            glob = walk.Glob.compile(_text(data, "pattern"))
        except walk.GlobInvalid as exc:
            raise Refusal(f"invalid pattern: {exc}") from exc
        base = fs.locate(root, _text(data, "path", required=False) or ".")
        if not base.path.is_dir():
            raise Refusal(f"{base.rel} is not a directory")
        budget = walk.Budget.start(
            seconds=GLOB_TIMEOUT_S, cancelled=ctx.cancelled, max_entries=GLOB_MAX_SCANNED, what="Glob"
        )
        hits = []
        for rel, mtime in walk.walk_files(base.path, budget):
            budget.check()
            if glob.match(rel):
                hits.append((rel, mtime))
        hits.sort(key=lambda h: (-h[1], h[0]))  # newest first; equal times by path
        prefix = "" if not base.parts else base.rel + "/"
        lines = [prefix + rel for rel, _ in hits[:GLOB_LIMIT]]
        more = len(hits) - GLOB_LIMIT
        text = "\n".join(lines) if lines else "No files found"
        text += f"\n[{more} more files not shown; narrow the pattern]" if more > 0 else ""
        return text + (f"\n[stopped after scanning {GLOB_MAX_SCANNED} files; narrow path]" if budget.capped else "")

    return run_file_tool(ctx, data, GLOB_FIELDS, body)


def file_tool_schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    volume = {"type": "string", "description": "bound volume name (default: the run's default or sole volume)"}
    return {"type": "object", "properties": {**props, "volume": volume}, "required": required}


_PATH = {"type": "string", "description": "path relative to the volume root"}

READ_TOOL = Tool(
    name="Read",
    description=f"Read a text file from a bound volume (truncated at {READ_CAP} bytes).",
    input_schema=file_tool_schema({"path": _PATH}, ["path"]),
    execute=read_execute,
)
WRITE_TOOL = Tool(
    name="Write",
    description=f"Write a file in a rw volume, atomically (creates directories; up to {WRITE_CAP} bytes).",
    input_schema=file_tool_schema({"path": _PATH, "content": {"type": "string"}}, ["path", "content"]),
    execute=write_execute,
)
EDIT_TOOL = Tool(
    name="Edit",
    description="Replace old_string with new_string in a file of a rw volume; old_string must be unique "
    "unless replace_all.",
    input_schema=file_tool_schema(
        {
            "path": _PATH,
            "old_string": {"type": "string"},
            "new_string": {"type": "string"},
            "replace_all": {"type": "boolean", "default": False},
        },
        ["path", "old_string", "new_string"],
    ),
    execute=edit_execute,
)
GLOB_TOOL = Tool(
    name="Glob",
    description=f"Files matching a glob (*, ?, [..], **) in a bound volume, newest first, at most {GLOB_LIMIT}.",
    input_schema=file_tool_schema({"pattern": {"type": "string"}, "path": _PATH}, ["pattern"]),
    execute=glob_execute,
)
