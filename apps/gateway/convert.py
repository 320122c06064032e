"""Chat messages of either wire shape -> the drivers' neutral `ProviderRequest`.

Rules: every system (or OpenAI `developer`) message joins the system prompt,
wherever it appears; a tool message becomes a `tool_result` block in a user
turn; consecutive turns of the same role merge into one (parallel tool
results arrive as one user turn, as Anthropic requires); empty text is
dropped (Anthropic refuses empty text blocks). Content is a string or a list
of parts: text parts (and an assistant's refusal parts) are joined; a user
message's `image_url` parts become image blocks (a `data:` URL is checked
here, an http(s) URL is fetched through the SSRF guard once the model is
known to see images: `images_ready`); any other part (input_audio, file, an
image outside a user message) is a 400, never silently dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from asgiref.sync import sync_to_async

from apps.core.errors import Invalid
from apps.core.hosts import run_allowed_hosts
from apps.gateway import images, vision
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


def user_blocks(content: str | list[ContentPartIn] | None, where: str) -> list[dict[str, Any]]:
    """A user message's content as neutral blocks: text parts joined, image_url parts as images."""
    if not isinstance(content, list):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        if part.type != "image_url":
            text = content_text([part], f"{where}.content[{i}]")
            if blocks and blocks[-1]["type"] == "text":
                blocks[-1]["text"] += text
            elif text:
                blocks.append({"type": "text", "text": text})
            continue
        blocks.append(_image(part, f"{where}.content[{i}]"))
    return blocks


def _image(part: ContentPartIn, where: str) -> dict[str, Any]:
    if part.image_url is None:
        raise bad_request(f"{where}.image_url: required for an image_url part")
    url = part.image_url.url
    if url.startswith("data:"):
        got = images.from_data_uri(url, where)
        return {"type": "image", "media_type": got.media_type, "data": got.data}
    return {"type": "image", "url": images.url_checked(url, where)}  # fetched by images_ready


def has_image(request: ProviderRequest) -> bool:
    return any(b.get("type") == "image" for m in request.messages for b in m["content"])


async def images_ready(request: ProviderRequest, provider: str, model: str) -> ProviderRequest:
    """400 `model_lacks_vision` for an image the routed model cannot see; otherwise each image
    given by URL fetched (through the SSRF guard, to the operator's LOOMCYCLE_HTTP_HOST_ALLOWLIST)."""
    if not has_image(request):
        return request
    vision.require_vision(provider, model)
    if not any("url" in b for m in request.messages for b in m["content"]):
        return request
    return await sync_to_async(_fetched, thread_sensitive=False)(request)


def _fetched(request: ProviderRequest) -> ProviderRequest:
    hosts = run_allowed_hosts(None)
    messages = []
    for i, message in enumerate(request.messages):
        content = []
        for block in message["content"]:
            if block.get("type") == "image" and "url" in block:
                got = images.fetch(block["url"], hosts=hosts, where=f"messages[{i}] image_url")
                block = {"type": "image", "media_type": got.media_type, "data": got.data}
            content.append(block)
        messages.append({**message, "content": content})
    return dataclasses.replace(request, messages=messages)


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

    def add_user_blocks(self, blocks: list[dict[str, Any]]) -> None:
        if blocks:
            self._append("user", blocks)

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
