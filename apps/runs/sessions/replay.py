"""What a run that replays its session sees (SPEC 2.3, 4.5): the transcript rows of the
session's earlier turns (not rolled back) before its own, read at each of its
iterations, never copied (no history that grows with the square of the turns)."""

from __future__ import annotations

from typing import Any

from apps.runs.sessions.selectors import Rows, session_history


def replayed_history(*, tenant_id: str, session_id: str, turn: int | None) -> Rows:
    """What a replaying run's model sees before its own rows: its session's turns
    before `turn` (all when None), each tool call answered (history_repaired)."""
    return history_repaired(session_history(tenant_id=tenant_id, session_id=session_id, before_turn=turn))


NO_RESULT = "no result: the run ended before this tool call was answered"


def history_repaired(rows: Rows) -> Rows:
    """The rows with an error `tool_result` after every assistant row whose tool_use
    is not answered before the next assistant row (a turn interrupted mid-call), so a
    replayed history never separates a tool_use from a result (the provider APIs
    refuse that). Linear: one backward pass collects, for each assistant row, the
    ids answered by the user rows up to the next assistant row; one forward pass
    writes."""
    answered_after: dict[int, set[str]] = {}
    following: set[str] = set()
    for i in range(len(rows) - 1, -1, -1):
        role, content = rows[i]
        if role == "assistant":
            answered_after[i], following = following, set()
        else:
            following.update(str(b.get("tool_use_id")) for b in content if b.get("type") == "tool_result")
    out: Rows = []
    for i, (role, content) in enumerate(rows):
        out.append((role, content))
        if role != "assistant":
            continue
        missing = [u for u in _tool_use_ids(content) if u not in answered_after[i]]
        if missing:
            out.append(("user", [_no_result(u) for u in missing]))
    return out


def _tool_use_ids(content: list[dict[str, Any]]) -> list[str]:
    return [str(b.get("id")) for b in content if b.get("type") == "tool_use"]


def _no_result(tool_use_id: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": NO_RESULT, "is_error": True}
