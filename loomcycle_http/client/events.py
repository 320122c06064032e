"""Run events as the streams send them (SPEC 3): `Event(type, data, seq)`.

`seq` is the event's persisted sequence number (the SSE `id:`), None for live-only frames
(`session`, `agent`, and the live text of a model call in flight: `"live": true` in its data,
whose SSE frame has no id of its own; loomcycle_http.client.live). A stream ends after its
terminal event: `done` or `error`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

TERMINAL_EVENTS = frozenset({"done", "error"})
TERMINAL_STATES = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True)
class Event:
    """One frame of a run's stream, or one persisted event of `runs.events`."""

    type: str
    data: dict[str, Any]
    seq: int | None = None

    @property
    def is_terminal(self) -> bool:
        return self.type in TERMINAL_EVENTS

    @property
    def text(self) -> str:
        """The text of a `text`, `thinking` or `tool_result` event ("" for others)."""
        return str(self.data.get("text") or "")

    @property
    def error(self) -> str:
        return str(self.data.get("error") or "")

    @property
    def tool_use(self) -> dict[str, Any]:
        value = self.data.get("tool_use")
        return value if isinstance(value, dict) else {}

    @property
    def usage(self) -> dict[str, Any]:
        value = self.data.get("usage")
        return value if isinstance(value, dict) else {}

    def to_json(self) -> str:
        """One line: `{"seq", "type", "data"}`."""
        return json.dumps({"seq": self.seq, "type": self.type, "data": self.data}, separators=(",", ":"))


def _is_live(payload: Any) -> bool:
    """A live frame (docs/api.md, "Live text"): an EventSource gives it the last id seen."""
    return isinstance(payload, dict) and payload.get("live") is True


def event_from_sse(event: str, data: str, event_id: str) -> Event:
    """An Event from one SSE frame's fields (an empty or non-numeric id is no seq)."""
    payload = json.loads(data) if data else {}
    return Event(
        type=event or "message",
        data=payload if isinstance(payload, dict) else {"value": payload},
        seq=int(event_id) if event_id.isdigit() and not _is_live(payload) else None,
    )


@dataclass(frozen=True)
class RunRef:
    """The handles of a run started in the background."""

    agent_id: str
    run_id: str
    session_id: str
    status: str
