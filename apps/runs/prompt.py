"""Prompt segments and transcript rows -> provider-neutral messages (SPEC 7.1).

System segments become system blocks; all user segments collapse into ONE
first user message; `untrusted-block` text is wrapped as `<kind>...</kind>`
with `<` escaped, so untrusted input cannot close its own wrapper.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel

from apps.core.errors import Invalid
from apps.runs.compacted import visible_rows

UNTRUSTED_KINDS = frozenset(
    {
        "untrusted",
        "web_content",
        "uploaded_cv",
        "qa_question",
        "user_input",
        "tool_output",
        "search_result",
        "run_metadata",
        "webhook_payload",
    }
)


class Segment(BaseModel):
    role: Literal["user", "system"] = "user"
    type: Literal["trusted-text", "untrusted-block", "image"] = "trusted-text"
    text: str = ""
    kind: str = "untrusted"
    cacheable: bool = False
    media_type: str | None = None
    data: str | None = None
    model_config = {"extra": "ignore"}


def _render(segment: Segment) -> str:
    if segment.type == "image":
        raise Invalid("image segments are not supported by this build yet", code="invalid_body")
    if segment.type == "untrusted-block":
        kind = segment.kind if segment.kind in UNTRUSTED_KINDS else "untrusted"
        return f"<{kind}>\n{segment.text.replace('<', '&lt;')}\n</{kind}>"
    return segment.text


def split_segments(segments: list[Segment]) -> tuple[list[str], str]:
    """-> (system blocks, the single user text)."""
    system = [_render(s) for s in segments if s.role == "system"]
    user = "\n\n".join(_render(s) for s in segments if s.role == "user")
    if not user.strip():
        raise Invalid("no input: prompt or a user segment is required", code="invalid_body")
    return system, user


def system_blocks(agent_prompt: str, request_system: list[str], metadata: dict[str, Any]) -> list[str]:
    blocks = [agent_prompt] if agent_prompt.strip() else []
    blocks.extend(request_system)
    if metadata:
        blocks.append("Run metadata (operator-authored, trusted):\n" + json.dumps(metadata, sort_keys=True))
    return blocks


def messages_from_rows(rows: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Merge consecutive same-role rows (tool results after one assistant turn
    become one user message, as the provider APIs require), after the latest
    compaction marker's rebuild (apps.runs.compacted.visible)."""
    messages: list[dict[str, Any]] = []
    for role, content in visible_rows(rows):
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(content)
        else:
            messages.append({"role": role, "content": list(content)})
    return messages
