"""Which provider models take images (apps.gateway.vision): the driver's default,
loomcycle's per-model refinements, and the endpoint's yaml `capabilities` winning
over both. Providers are yaml entries never called."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.core.errors import Invalid
from apps.gateway.providers import registry
from apps.gateway.vision import has_vision, require_vision

NOWHERE = "http://127.0.0.1:9"


@pytest.fixture(autouse=True)
def providers(settings: Any, tmp_path: Path) -> Iterator[None]:
    block = {
        "v-anthropic": {"driver": "anthropic", "base_url": NOWHERE},
        "v-openai": {"driver": "openai", "dialect": "openai", "base_url": NOWHERE},
        "v-deepseek": {"driver": "openai", "dialect": "deepseek", "base_url": NOWHERE},
        "v-gemini": {"driver": "gemini", "base_url": NOWHERE},
        "v-ollama": {"driver": "ollama", "base_url": NOWHERE},
        "v-llava": {"driver": "ollama", "base_url": NOWHERE, "capabilities": {"vision": True}},
        "v-blind-compat": {"driver": "openai", "base_url": NOWHERE, "capabilities": {"vision": False}},
    }
    path = tmp_path / "vision.yaml"
    path.write_text(json.dumps({"providers": block}))
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, config_files=(str(path),), mock_enabled=True)
    registry._providers.cache_clear()
    yield
    registry._providers.cache_clear()


@pytest.mark.parametrize(
    ("provider", "model", "sees"),
    [
        ("v-anthropic", "claude-sonnet-4-5", True),
        ("v-anthropic", "claude-2.1", False),
        ("v-anthropic", "claude-instant-1.2", False),
        ("v-openai", "gpt-4o", True),
        ("v-openai", "gpt-4-turbo", True),
        ("v-openai", "gpt-4-0125-preview", True),  # the exact old snapshots only, not a prefix
        ("v-openai", "gpt-4", False),
        ("v-openai", "gpt-4-32k-0613", False),
        ("v-openai", "gpt-3.5-turbo", False),
        ("v-deepseek", "deepseek-chat", False),
        ("v-gemini", "gemini-2.5-flash", True),
        ("v-ollama", "llama3", False),
        ("v-llava", "llava", True),
        ("v-blind-compat", "gpt-4o", False),
        ("mock", "mock-generic", True),
    ],
)
def test_vision_by_driver_model_and_declared_capability(provider: str, model: str, sees: bool) -> None:
    assert has_vision(provider, model) is sees


def test_require_vision_names_the_model_and_the_way_out() -> None:
    with pytest.raises(Invalid) as exc:
        require_vision("v-ollama", "llama3")
    assert exc.value.status == 400 and exc.value.code == "model_lacks_vision"
    assert exc.value.details == {"provider": "v-ollama", "model": "llama3"}
    assert "capabilities: {vision: true}" in exc.value.message
