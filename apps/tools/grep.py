"""The `Grep` tool (SPEC 6.9, Claude Code's input shape).

Patterns run on the `regex` package with a deadline for the whole call
(`GREP_TIMEOUT_S`): a model's pattern that backtracks catastrophically ends
in an is_error result instead of holding a worker thread. `regex` is a
backtracking engine, not RE2 (docs/compat.md): the timeout, not linear time,
is the guarantee. Binary files (a NUL in the first 8 KiB) and files over
`GREP_MAX_FILE` bytes are skipped, and the output says how many.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex

from apps.core.tools import Tool, ToolContext, ToolResult, VolumeBinding
from apps.tools import fs, walk
from apps.tools.files import Refusal, file_tool_schema, run_file_tool

GREP_TIMEOUT_S = 5.0
GREP_OUTPUT_CAP = 256 * 1024
GREP_MAX_FILE = 8 * 1024 * 1024
HEAD_LIMIT = 100
MAX_CONTEXT = 100  # -A/-B/-C above this are clamped to it
GREP_MAX_SCANNED = 100_000  # files listed before the search stops
MODES = ("files_with_matches", "content", "count")
FIELDS = frozenset(
    {"pattern", "path", "volume", "glob", "output_mode", "case_insensitive", "-i", "multiline", "head_limit"}
    | {"-A", "-B", "-C", "-n"}
)


_TIMED_OUT = f"Grep took longer than {GREP_TIMEOUT_S:g} s and was stopped; simplify the pattern or narrow path"


@dataclass
class Query:
    rx: Any  # regex.Pattern[str]
    mode: str
    multiline: bool
    before: int
    after: int
    head_limit: int
    numbers: bool
    budget: walk.Budget
    skipped: dict[str, int] = field(default_factory=lambda: {"binary": 0, "large": 0, "unreadable": 0})


def _int(data: dict[str, Any], key: str, default: int) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Refusal(f"{key} must be a non-negative integer")
    return value


def _context(data: dict[str, Any], key: str, default: int) -> int:
    return min(_int(data, key, default), MAX_CONTEXT)


def _query(data: dict[str, Any], cancelled: threading.Event) -> Query:
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
    numbers = data.get("-n", True)
    if not isinstance(numbers, bool):
        raise Refusal("-n must be a boolean")
    context = _context(data, "-C", 0)
    return Query(
        rx=rx,
        mode=mode,
        multiline=multiline,
        before=_context(data, "-B", context),
        after=_context(data, "-A", context),
        head_limit=_int(data, "head_limit", HEAD_LIMIT) or HEAD_LIMIT,
        numbers=numbers,
        budget=walk.Budget.start(
            seconds=GREP_TIMEOUT_S, cancelled=cancelled, max_entries=GREP_MAX_SCANNED, what="Grep"
        ),
    )


def _left(q: Query) -> float:
    return q.budget.left()


def _matching_lines(q: Query, text: str) -> list[int]:
    """0-based numbers of the lines with a match (a multiline match marks every line it spans)."""
    try:
        if not q.multiline:
            return [i for i, line in enumerate(text.split("\n")) if q.rx.search(line, timeout=_left(q))]
        starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        hit: set[int] = set()
        for m in q.rx.finditer(text, timeout=_left(q)):
            _left(q)
            first = bisect.bisect_right(starts, m.start()) - 1
            last = bisect.bisect_right(starts, max(m.end() - 1, m.start())) - 1
            hit.update(range(first, last + 1))
        return sorted(hit)
    except TimeoutError as exc:
        raise walk.BudgetExceeded(_TIMED_OUT) from exc


def _content_lines(shown: str, text: str, hits: list[int], q: Query, room: int) -> list[str]:
    """At most `room` output lines: each hit with its context, overlapping ranges merged
    (every line is visited once, whatever -A/-B/-C are)."""
    lines = text.split("\n")
    hit_set = set(hits)
    out: list[str] = []
    done = -1  # the last line already emitted
    for h in hits:
        for i in range(max(done + 1, h - q.before), min(len(lines), h + q.after + 1)):
            if len(out) >= room:
                return out
            _left(q)
            sep = ":" if i in hit_set else "-"
            out.append(f"{shown}{sep}{i + 1}{sep}{lines[i]}" if q.numbers else f"{shown}{sep}{lines[i]}")
            done = i
    return out


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


def _targets(base: fs.Located, glob: str, q: Query) -> list[tuple[str, fs.Located]]:
    """(shown path relative to the volume root, where it is) of the files to search."""
    if base.path.is_file():
        return [(base.rel, base)]
    prefix = "" if not base.parts else base.rel + "/"
    files = sorted(rel for rel, _ in walk.walk_files(base.path, q.budget))
    return [
        (prefix + rel, fs.Located(root=base.root, parts=base.parts + Path(rel).parts))
        for rel in files
        if not glob or walk.name_matches(glob, Path(rel).name)
    ]


def _search(q: Query, targets: list[tuple[str, fs.Located]]) -> list[str]:
    out: list[str] = []
    for shown, loc in targets:
        if len(out) >= q.head_limit:
            break
        _left(q)
        text = _file_text(loc, q)
        hits = _matching_lines(q, text) if text is not None else []
        if not hits:
            continue
        if q.mode == "files_with_matches":
            out.append(shown)
        elif q.mode == "count":
            out.append(f"{shown}:{len(hits)}")
        else:
            out.extend(_content_lines(shown, text or "", hits, q, q.head_limit - len(out)))
    return out[: q.head_limit]


def _render(q: Query, lines: list[str]) -> str:
    text = "\n".join(lines) if lines else "No matches found"
    notes = [f"{n} {kind} file(s) skipped" for kind, n in q.skipped.items() if n]
    if q.budget.capped:
        notes.append(f"stopped after listing {GREP_MAX_SCANNED} files; narrow path or glob")
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
        q = _query(data, ctx.cancelled)
        glob = data.get("glob") or ""
        if not isinstance(glob, str) or "/" in glob:
            raise Refusal("glob must be a single path segment such as *.py")
        try:
            walk.segment_tokens(glob)
        except walk.GlobInvalid as exc:
            raise Refusal(f"invalid glob: {exc}") from exc
        base = fs.locate(root, data.get("path") or ".")
        if not base.path.exists():
            raise FileNotFoundError(base.rel)
        return _render(q, _search(q, _targets(base, glob, q)))

    return run_file_tool(ctx, data, FIELDS, body)


GREP_TOOL = Tool(
    name="Grep",
    description="Search file contents in a bound volume with a regular expression. output_mode "
    f"files_with_matches (default), content (path:line:text, with -A/-B/-C context up to {MAX_CONTEXT}; "
    "-n false drops the line numbers) or count.",
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
            "-n": {"type": "boolean", "default": True, "description": "line numbers in content mode"},
        },
        ["pattern"],
    ),
    execute=grep_execute,
)
