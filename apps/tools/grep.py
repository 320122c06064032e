"""The `Grep` tool (SPEC 6.9, Claude Code's input shape).

Patterns run on the `regex` package with a deadline for the whole call
(`GREP_TIMEOUT_S`): a model's pattern that backtracks catastrophically ends
in an is_error result instead of holding a worker thread. `regex` is a
backtracking engine, not RE2 (docs/compat.md): the timeout, not linear time,
is the guarantee. Binary files (a NUL in the first 8 KiB) and files over
`GREP_MAX_FILE` bytes are skipped, and the output says how many.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import regex

from apps.core.tools import Tool, ToolContext, ToolResult, VolumeBinding
from apps.tools import fs
from apps.tools.files import Refusal, file_tool_schema, run_file_tool, walk_files

GREP_TIMEOUT_S = 5.0
GREP_OUTPUT_CAP = 256 * 1024
GREP_MAX_FILE = 8 * 1024 * 1024
HEAD_LIMIT = 100
MODES = ("files_with_matches", "content", "count")
FIELDS = frozenset(
    {"pattern", "path", "volume", "glob", "output_mode", "case_insensitive", "-i", "multiline", "head_limit"}
    | {"-A", "-B", "-C", "-n"}
)


class GrepTimeout(Exception):
    pass


@dataclass
class Query:
    rx: Any  # regex.Pattern[str]
    mode: str
    multiline: bool
    before: int
    after: int
    head_limit: int
    deadline: float
    skipped: dict[str, int] = field(default_factory=lambda: {"binary": 0, "large": 0, "unreadable": 0})


def _int(data: dict[str, Any], key: str, default: int) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Refusal(f"{key} must be a non-negative integer")
    return value


def _query(data: dict[str, Any]) -> Query:
    pattern = data.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise Refusal("pattern must be a non-empty string")
    mode = data.get("output_mode", "files_with_matches")
    if mode not in MODES:
        raise Refusal(f"output_mode must be one of {', '.join(MODES)}")
    flags = regex.V0 | (regex.IGNORECASE if data.get("case_insensitive") or data.get("-i") else 0)
    multiline = bool(data.get("multiline"))
    flags |= regex.DOTALL | regex.MULTILINE if multiline else 0
    try:
        rx = regex.compile(pattern, flags)
    except regex.error as exc:
        raise Refusal(f"invalid pattern: {exc}") from exc
    context = _int(data, "-C", 0)
    return Query(
        rx=rx,
        mode=mode,
        multiline=multiline,
        before=_int(data, "-B", context),
        after=_int(data, "-A", context),
        head_limit=_int(data, "head_limit", HEAD_LIMIT) or HEAD_LIMIT,
        deadline=time.monotonic() + GREP_TIMEOUT_S,
    )


def _left(q: Query) -> float:
    left = q.deadline - time.monotonic()
    if left <= 0:
        raise GrepTimeout()
    return left


def _matching_lines(q: Query, text: str) -> list[int]:
    """0-based numbers of the lines with a match (a multiline match marks every line it spans)."""
    try:
        if not q.multiline:
            return [i for i, line in enumerate(text.split("\n")) if q.rx.search(line, timeout=_left(q))]
        hit: set[int] = set()
        for m in q.rx.finditer(text, timeout=_left(q)):
            first = text.count("\n", 0, m.start())
            hit.update(range(first, first + text.count("\n", m.start(), max(m.end(), m.start())) + 1))
        return sorted(hit)
    except TimeoutError as exc:
        raise GrepTimeout() from exc


def _content_lines(shown: str, text: str, hits: list[int], q: Query) -> list[str]:
    lines = text.split("\n")
    wanted: dict[int, bool] = {}
    for h in hits:
        for i in range(max(0, h - q.before), min(len(lines), h + q.after + 1)):
            wanted[i] = wanted.get(i, False) or i == h
    return [
        f"{shown}{':' if is_hit else '-'}{i + 1}{':' if is_hit else '-'}{lines[i]}"
        for i, is_hit in sorted(wanted.items())
    ]


def _file_text(loc: fs.Located, q: Query) -> str | None:
    """The file's text through the same O_NOFOLLOW walk as Read (a path swapped for a
    symlink during the search is refused); None for a skipped file."""
    try:
        raw, size = fs.read_bytes(loc, GREP_MAX_FILE)
    except (fs.PathRefused, FileNotFoundError, IsADirectoryError):
        q.skipped["unreadable"] += 1  # gone, swapped or not a regular file since the listing
        return None
    if size > GREP_MAX_FILE:
        q.skipped["large"] += 1
        return None
    if b"\x00" in raw[:8192]:
        q.skipped["binary"] += 1
        return None
    return raw.decode("utf-8", errors="replace")


def _targets(base: fs.Located, glob: str) -> list[tuple[str, fs.Located]]:
    """(shown path relative to the volume root, where it is) of the files to search."""
    if base.path.is_file():
        return [(base.rel, base)]
    prefix = "" if not base.parts else base.rel + "/"
    files = sorted(rel for rel, _ in walk_files(base.path))
    return [
        (prefix + rel, fs.Located(root=base.root, parts=base.parts + Path(rel).parts))
        for rel in files
        if not glob or fnmatchcase(Path(rel).name, glob)
    ]


def _search(q: Query, targets: list[tuple[str, fs.Located]]) -> list[str]:
    out: list[str] = []
    for shown, loc in targets:
        if len(out) >= q.head_limit:
            break
        text = _file_text(loc, q)
        hits = _matching_lines(q, text) if text is not None else []
        if not hits:
            continue
        if q.mode == "files_with_matches":
            out.append(shown)
        elif q.mode == "count":
            out.append(f"{shown}:{len(hits)}")
        else:
            out.extend(_content_lines(shown, text or "", hits, q))
    return out[: q.head_limit]


def _render(q: Query, lines: list[str]) -> str:
    text = "\n".join(lines) if lines else "No matches found"
    notes = [f"{n} {kind} file(s) skipped" for kind, n in q.skipped.items() if n]
    if notes:
        text += "\n[" + "; ".join(notes) + "]"
    data = text.encode()
    if len(data) > GREP_OUTPUT_CAP:
        text = (
            data[:GREP_OUTPUT_CAP].decode("utf-8", errors="ignore") + f"\n[output truncated at {GREP_OUTPUT_CAP} bytes]"
        )
    return text


def grep_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    def body(root: Path, binding: VolumeBinding) -> str:
        q = _query(data)
        glob = data.get("glob") or ""
        if not isinstance(glob, str) or "/" in glob:
            raise Refusal("glob must be a single path segment such as *.py")
        base = fs.locate(root, data.get("path") or ".")
        if not base.path.exists():
            raise FileNotFoundError(base.rel)
        try:
            return _render(q, _search(q, _targets(base, glob)))
        except GrepTimeout as exc:
            raise Refusal(f"pattern took longer than {GREP_TIMEOUT_S:g} s and was stopped; simplify it") from exc

    return run_file_tool(ctx, data, FIELDS, body)


GREP_TOOL = Tool(
    name="Grep",
    description="Search file contents in a bound volume with a regular expression. output_mode "
    "files_with_matches (default), content (path:line:text, with -A/-B/-C context) or count.",
    input_schema=file_tool_schema(
        {
            "pattern": {"type": "string"},
            "path": {"type": "string", "description": "file or directory relative to the volume root"},
            "glob": {"type": "string", "description": "file-name filter, one segment (e.g. *.py)"},
            "output_mode": {"type": "string", "enum": list(MODES)},
            "case_insensitive": {"type": "boolean"},
            "multiline": {"type": "boolean"},
            "head_limit": {"type": "integer", "default": HEAD_LIMIT},
            "-A": {"type": "integer"},
            "-B": {"type": "integer"},
            "-C": {"type": "integer"},
        },
        ["pattern"],
    ),
    execute=grep_execute,
)
