"""The gateway tests' shapes: the operator's provider key of the alternate web process, and an
OpenAI streaming chunk as the fake upstream sends it."""

from __future__ import annotations

import json
from typing import Any

OPERATOR_KEY = "sk-operator-test-key-0123456789"


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    # Shape from the OpenAI Chat Completions streaming reference (chat.completion.chunk objects),
    # https://platform.openai.com/docs/api-reference/chat-streaming
    body = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 0, "model": "up-model"}
    body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + json.dumps(body).encode() + b"\n\n"
