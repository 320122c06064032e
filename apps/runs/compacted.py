"""Context compaction's history rules (docs/compaction.md): pure functions of transcript rows.

A compaction is a transcript row of its own role, MARKER_ROLE, appended after
the rows it summarises; no row is deleted or rewritten. Its one block:
`{"type": "compaction", "summary", "kept_rows", "keep_first", "keep_n",
"trigger", "before_tokens", "after_tokens"}`. `kept_rows` counts the rows
right before the marker that stay verbatim: relative to the marker, so the
same rows at another offset rebuild the same history.

The history a model call sees (`visible`): with no marker, every row; after
the latest marker, the first row (when `keep_first`), the summary as a user
text row, then every row from `kept_rows` before the marker on (markers never).
Each later compaction summarises that history, so the summaries chain.

Invariants:
- a cut lands only at a turn start: a user row with no tool_result block,
  before which every tool_use has its tool_result. A tool_use and its result
  are never separated, and the kept part opens with a user turn;
- the turn in progress is always kept (keep_n >= 1), so the latest user
  text, whatever it asked, reaches the model verbatim.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MARKER_ROLE = "compaction"
MARKER_TYPE = "compaction"
SUMMARY_HEADER = "[Summary of the earlier conversation, written when it was compacted]\n"
RENDER_BLOCK_CHARS = 4000  # one block's share of the summary request (a huge tool result is cut)

Row = tuple[str, list[dict[str, Any]]]


@dataclass(frozen=True)
class Entry:
    """One row of the visible history; `idx` is its index in the rows given, None for the summary."""

    idx: int | None
    role: str
    content: list[dict[str, Any]]


@dataclass(frozen=True)
class Cut:
    """Where a compaction cuts the visible history: `view[lead:at]` is summarised,
    `view[at:]` kept (lead is 1 when the first row is kept ahead of the summary)."""

    view: list[Entry]
    lead: int
    at: int

    @property
    def summarised(self) -> list[Entry]:
        return self.view[self.lead : self.at]

    @property
    def kept(self) -> list[Entry]:
        return self.view[self.at :]


def is_marker(role: str) -> bool:
    return role == MARKER_ROLE


def _latest_marker(rows: Sequence[Row]) -> int | None:
    for i in range(len(rows) - 1, -1, -1):
        if is_marker(rows[i][0]):
            return i
    return None


def visible(rows: Sequence[Row]) -> list[Entry]:
    """The history the next model call is built from (module docstring)."""
    at = _latest_marker(rows)
    if at is None:
        return [Entry(i, role, content) for i, (role, content) in enumerate(rows)]
    block = rows[at][1][0]
    start = max(0, at - int(block.get("kept_rows", 0)))
    keep_first = bool(block.get("keep_first"))
    out = [Entry(0, *rows[0])] if keep_first and rows else []
    out.append(Entry(None, "user", [{"type": "text", "text": SUMMARY_HEADER + str(block.get("summary", ""))}]))
    for i in range(start, len(rows)):
        role, content = rows[i]
        if not is_marker(role) and not (keep_first and i == 0):
            out.append(Entry(i, role, content))
    return out


def visible_rows(rows: Sequence[Row]) -> Sequence[Row]:
    """`visible` as (role, content) rows, what prompt.messages_from_rows merges into messages
    (the rows themselves when there is no marker: every model call passes here)."""
    if _latest_marker(rows) is None:
        return rows
    return [(e.role, e.content) for e in visible(rows)]


def turn_starts(view: Sequence[Entry]) -> list[int]:
    """Positions in `view` where a cut is clean: a user row of the transcript with no
    tool_result block, with no tool_use before it still waiting for its result."""
    waiting: set[str] = set()
    starts = []
    for pos, entry in enumerate(view):
        kinds = {b.get("type") for b in entry.content}
        if entry.idx is not None and entry.role == "user" and "tool_result" not in kinds and not waiting:
            starts.append(pos)
        for block in entry.content:
            if block.get("type") == "tool_use":
                waiting.add(str(block.get("id")))
            elif block.get("type") == "tool_result":
                waiting.discard(str(block.get("tool_use_id")))
    return starts


def choose_cut(
    view: list[Entry], *, keep_n: int, keep_first: bool, fits: Callable[[list[Entry]], bool] | None = None
) -> Cut | None:
    """The cut keeping the last `keep_n` turns (fewer, down to one, while the kept part
    does not `fit`); None when no clean cut leaves a transcript row to summarise."""
    lead = 1 if keep_first and view and view[0].idx == 0 else 0
    options = [
        p for p in turn_starts(view)[-max(1, keep_n) :] if p > lead and any(e.idx is not None for e in view[lead:p])
    ]
    if not options:
        return None
    at = next((p for p in options if fits is None or fits(view[p:])), options[-1])
    return Cut(view=view, lead=lead, at=at)


def marker_row(
    *, summary: str, cut: Cut, marker_idx: int, keep_n: int, trigger: str, before_tokens: int, after_tokens: int
) -> Row:
    """The marker appended at index `marker_idx` (right after the rows the cut was made on)."""
    first_kept = cut.view[cut.at].idx
    assert first_kept is not None  # a cut is at a transcript row (turn_starts)
    block = {
        "type": MARKER_TYPE,
        "summary": summary,
        "kept_rows": marker_idx - first_kept,
        "keep_first": cut.lead == 1,
        "keep_n": keep_n,
        "trigger": trigger,
        "before_tokens": before_tokens,
        "after_tokens": after_tokens,
    }
    return (MARKER_ROLE, [block])


def after_view(cut: Cut, summary: str) -> list[Entry]:
    """The visible history once the cut's marker is appended (before any later row)."""
    head = cut.view[: cut.lead]
    note = Entry(None, "user", [{"type": "text", "text": SUMMARY_HEADER + summary}])
    return [*head, note, *cut.kept]


def render(entries: Sequence[Entry]) -> str:
    """The entries as plain text for the summary request: provider-neutral (no
    tool_use block reaches a call made without tools), reasoning left out."""
    lines = []
    for entry in entries:
        for block in entry.content:
            line = _render_block(entry.role, block)
            if line:
                lines.append(line[:RENDER_BLOCK_CHARS])
    return "\n".join(lines)


def _render_block(role: str, block: dict[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return f"{role}: {block.get('text', '')}"
    if kind == "tool_use":
        return f"{role} called tool {block.get('name', '')} with {json.dumps(block.get('input'), sort_keys=True)}"
    if kind == "tool_result":
        flag = " (error)" if block.get("is_error") else ""
        return f"tool result{flag}: {block.get('content', '')}"
    return ""  # thinking blocks and anything else: not part of what is summarised
