"""A run's persisted events as a readable timeline (the run console's run
page): messages, tool calls with their inputs and results, other events,
errors. A presenter: no reads or writes of its own."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any


class ItemKind(enum.StrEnum):
    USER = "user"
    SYSTEM = "system"
    ASSISTANT = "assistant"
    THINKING = "thinking"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    ERROR = "error"
    DONE = "done"
    EVENT = "event"


@dataclass(frozen=True)
class TimelineItem:
    seq: int
    step: int
    at: datetime | None
    kind: ItemKind
    title: str
    text: str = ""
    detail: str = ""  # indented JSON: a tool call's input, an event's payload
    is_error: bool = False
    worker_version: str = ""  # the code version of the worker whose iteration appended it


def timeline(events: list[dict[str, Any]]) -> list[TimelineItem]:
    """One item per event (rows of apps.runs.selectors.run_events_since), in seq order."""
    return [_item(row) for row in events]


def _item(row: dict[str, Any]) -> TimelineItem:
    kind, p = str(row["type"]), row["payload"]
    base: dict[str, Any] = {
        "seq": int(row["seq"]),
        "step": int(row.get("step") or 0),
        "at": row.get("created_at"),
        "worker_version": str(row.get("worker_version") or ""),
    }
    if kind in _PRESENTERS:
        return _PRESENTERS[kind](base, p)
    return TimelineItem(**base, kind=ItemKind.EVENT, title=kind, detail=_pretty(_without_type(p)))


def _user(base: dict[str, Any], p: dict[str, Any]) -> TimelineItem:
    texts = [str(s.get("text", "")) for s in p.get("segments", []) if s.get("role", "user") == "user"]
    source = str(p.get("source", ""))
    title = f"user ({source})" if source else "user"
    return TimelineItem(**base, kind=ItemKind.USER, title=title, text="\n\n".join(texts))


def _system(base: dict[str, Any], p: dict[str, Any]) -> TimelineItem:
    return TimelineItem(**base, kind=ItemKind.SYSTEM, title="system prompt", text=str(p.get("system_prompt", "")))


def _assistant(base: dict[str, Any], p: dict[str, Any]) -> TimelineItem:
    return TimelineItem(**base, kind=ItemKind.ASSISTANT, title="assistant", text=str(p.get("text", "")))


def _thinking(base: dict[str, Any], p: dict[str, Any]) -> TimelineItem:
    return TimelineItem(**base, kind=ItemKind.THINKING, title="thinking", text=str(p.get("text", "")))


def _tool_call(base: dict[str, Any], p: dict[str, Any]) -> TimelineItem:
    use = p.get("tool_use") or {}
    title = f"tool call {use.get('name', '?')} ({use.get('id', '')})"
    return TimelineItem(**base, kind=ItemKind.TOOL_CALL, title=title, detail=_pretty(use.get("input", {})))


def _tool_result(base: dict[str, Any], p: dict[str, Any]) -> TimelineItem:
    use = p.get("tool_use") or {}
    error = bool(p.get("is_error"))
    title = f"tool result {use.get('name', '')} ({use.get('id', '')})" + (" error" if error else "")
    return TimelineItem(**base, kind=ItemKind.TOOL_RESULT, title=title, text=str(p.get("text", "")), is_error=error)


def _error(base: dict[str, Any], p: dict[str, Any]) -> TimelineItem:
    return TimelineItem(**base, kind=ItemKind.ERROR, title="error", text=str(p.get("error", "")), is_error=True)


def _done(base: dict[str, Any], p: dict[str, Any]) -> TimelineItem:
    title = "cancelled" if p.get("cancelled") else "done"
    return TimelineItem(**base, kind=ItemKind.DONE, title=title, text=str(p.get("stop_reason", "")))


_PRESENTERS = {
    "user_input": _user,
    "system_prompt": _system,
    "text": _assistant,
    "thinking": _thinking,
    "tool_call": _tool_call,
    "tool_result": _tool_result,
    "error": _error,
    "done": _done,
}


def _without_type(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k != "type"}


def _pretty(value: Any) -> str:
    if value in ({}, None):
        return ""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
