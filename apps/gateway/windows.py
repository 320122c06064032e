"""Context windows and token estimates, for context compaction (docs/compaction.md).

A provider declares its window in `Capabilities.max_context_tokens`; one that
declares none (the mock, Ollama, an HTTP provider without it) is assumed to
have `LOOMCYCLE_CONTEXT_WINDOW_DEFAULT` tokens, a conservative guess.

The estimate is a character count, not a tokenizer: about four characters a
token for English text and JSON, the same on every provider, so a threshold
behaves alike everywhere. It undercounts text that tokenizes densely (CJK
runs nearer one or two characters a token): set thresholds lower for it.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from apps.gateway.providers import get_provider, has_provider

CHARS_PER_TOKEN = 4
# What one image costs at most on Anthropic (about 1.15 megapixels, the size it scales images down to).
IMAGE_TOKENS = 1600


def context_window(provider_id: str) -> int:
    """The window, in tokens, of the models `provider_id` serves (always > 0)."""
    if has_provider(provider_id):
        declared = get_provider(provider_id).capabilities.max_context_tokens
        if declared > 0:
            return declared
    return int(settings.LOOMCYCLE.context_window_default)


def _is_image(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "image"


def estimate_tokens(system: list[str], messages: list[dict[str, Any]]) -> int:
    """Tokens a request of these system blocks and messages costs, estimated
    from their characters (messages as compact JSON, as the wire carries them).
    An image counts IMAGE_TOKENS, not its base64: providers bill an image by its
    pixels, and a megabyte of base64 counted as text would trigger compaction."""
    images = sum(1 for m in messages if isinstance(m.get("content"), list) for b in m["content"] if _is_image(b))
    texts = [
        {**m, "content": [b for b in m["content"] if not _is_image(b)]} if isinstance(m.get("content"), list) else m
        for m in messages
    ]
    chars = sum(len(block) for block in system) + len(json.dumps(texts, separators=(",", ":"), ensure_ascii=False))
    return (chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN + images * IMAGE_TOKENS
