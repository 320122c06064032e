"""A run's conversation rebuilt from its persisted events (GET /v1/runs/{id}/events).

The runtime has no transcript endpoint; its events carry every part of the
conversation, and this rebuilds it in the shape the engine hands to a
provider (apps/runs/prompt.py): messages `{"role", "content": [blocks]}`,
consecutive same-role blocks merged into one message, tool results as
`tool_result` blocks of a user message. One addition: the run's system text
(the `system_prompt` event) comes first, as a `system` message.

Blocks: `{"type": "text", "text"}`, `{"type": "thinking", "thinking"}`,
`{"type": "tool_use", "id", "name", "input"}`,
`{"type": "tool_result", "tool_use_id", "content", "is_error"}`.
"""

from __future__ import annotations

from typing import Any

# As apps/runs/prompt.py renders an `untrusted-block` segment.
_UNTRUSTED_KINDS = frozenset(
    {
        "untrusted",
        "web_content",
        "uploaded_cv",
        "qa_question",
        "user_input",
        "tool_output",
        "search_result",
        "run_metadata",
    }
)


def _segment_text(segment: dict[str, Any]) -> str:
    text = str(segment.get("text", ""))
    if segment.get("type") != "untrusted-block":
        return text
    kind = segment.get("kind") if segment.get("kind") in _UNTRUSTED_KINDS else "untrusted"
    return f"<{kind}>\n{text.replace('<', '&lt;')}\n</{kind}>"


def _user_text(payload: dict[str, Any]) -> str:
    segments = [s for s in payload.get("segments", []) if isinstance(s, dict) and s.get("role", "user") == "user"]
    # An image's bytes are not in the event (the runtime keeps them in its transcript): text only.
    return "\n\n".join(_segment_text(s) for s in segments if s.get("type") != "image")


def _block(kind: str, payload: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(role, block) for an event that is part of the conversation, else None."""
    if kind == "system_prompt":
        return "system", {"type": "text", "text": str(payload.get("system_prompt", ""))}
    if kind == "user_input":
        return "user", {"type": "text", "text": _user_text(payload)}
    if kind == "text":
        return "assistant", {"type": "text", "text": str(payload.get("text", ""))}
    if kind == "thinking":
        return "assistant", {"type": "thinking", "thinking": str(payload.get("text", ""))}
    use = payload.get("tool_use") or {}
    if kind == "tool_call":
        return "assistant", {
            "type": "tool_use",
            "id": use.get("id"),
            "name": use.get("name"),
            "input": use.get("input"),
        }
    if kind == "tool_result":
        result = {"type": "tool_result", "tool_use_id": use.get("id"), "content": str(payload.get("text", ""))}
        return "user", {**result, "is_error": bool(payload.get("is_error"))}
    return None


def transcript_from_events(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """Persisted events (in seq order) -> the conversation's messages."""
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for row in rows:
        found = _block(str(row.get("type")), row.get("payload") or {})
        if found is None:
            continue
        role, block = found
        if role == "system":  # stored after the first user_input; it heads the conversation
            system.append(block)
        elif messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})
    head = [{"role": "system", "content": system}] if system else []
    return tuple(head + messages)
