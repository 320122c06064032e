"""Chat messages of either wire shape -> the drivers' neutral `ProviderRequest`.

Rules: every system (or OpenAI `developer`) message joins the system prompt,
wherever it appears; a tool message becomes a `tool_result` block in a user
turn; consecutive turns of the same role merge into one (parallel tool
results arrive as one user turn, as Anthropic requires); empty text is
dropped (Anthropic refuses empty text blocks). Content is a string or a list
of parts: text parts (and an assistant's refusal parts) are joined; any other
part (image_url, input_audio, file) is a 400, never silently dropped.
"""

from __future__ import annotations

from typing import Any

from apps.core.errors import Invalid
from apps.gateway.providers import ProviderRequest, ToolSpec
from apps.gateway.schemas import ContentPartIn

DEFAULT_MAX_TOKENS = 4096


def bad_request(message: str) -> Invalid:
    return Invalid(message, code="bad_request")


def content_text(content: str | list[ContentPartIn] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts: list[str] = []
    for i, part in enumerate(content):
        if part.type == "text" and part.text is not None:
            texts.append(part.text)
        elif part.type == "refusal" and part.refusal is not None:
            texts.append(part.refusal)
        else:
            raise bad_request(f"{where}.content[{i}]: content part type {part.type!r} is not supported (text only)")
    return "".join(texts)


class Conversation:
    def __init__(self) -> None:
        self.system: list[str] = []
        self.messages: list[dict[str, Any]] = []

    def add_system(self, text: str) -> None:
        if text:
            self.system.append(text)

    def add_user(self, text: str) -> None:
        if text:
            self._append("user", [{"type": "text", "text": text}])

    def add_assistant(self, text: str, calls: list[tuple[str, str, dict[str, Any]]]) -> None:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        blocks += [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in calls]
        if blocks:
            self._append("assistant", blocks)

    def add_tool_result(self, tool_use_id: str, text: str, where: str) -> None:
        if not tool_use_id:
            raise bad_request(f"{where}: a tool message needs tool_call_id")
        self._append("user", [{"type": "tool_result", "tool_use_id": tool_use_id, "content": text, "is_error": False}])

    def _append(self, role: str, blocks: list[dict[str, Any]]) -> None:
        if self.messages and self.messages[-1]["role"] == role:
            last = self.messages[-1]["content"]
            # tool results lead a user turn (Anthropic wants them before any text)
            results = [b for b in blocks if b["type"] == "tool_result"]
            if results and role == "user":
                lead = [b for b in last if b["type"] == "tool_result"]
                rest = [b for b in last if b["type"] != "tool_result"]
                last[:] = lead + results + rest + [b for b in blocks if b["type"] != "tool_result"]
                return
            last.extend(blocks)
            return
        self.messages.append({"role": role, "content": blocks})

    def request(
        self,
        *,
        tools: list[ToolSpec],
        max_tokens: int | None,
        sampling: dict[str, Any],
        effort: str = "",
    ) -> ProviderRequest:
        if not self.messages:
            raise bad_request("messages: at least one user or assistant message with content is required")
        return ProviderRequest(
            model="",  # the routed model replaces it
            system=self.system,
            messages=self.messages,
            tools=tools,
            max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
            sampling={k: v for k, v in sampling.items() if v is not None},
            effort=effort,
        )
