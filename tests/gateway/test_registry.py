"""The yaml `providers:` block on top of the built-in providers (SPEC 7.2)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from apps.core.errors import Invalid
from apps.gateway.providers.registry import provider_configs


def test_a_yaml_entry_adds_an_openai_compatible_endpoint_with_its_knobs(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    monkeypatch.setenv("VLLM_KEY", "sk-vllm")
    raw = {
        "driver": "openai",
        "base_url": "http://127.0.0.1:8000/v1/",
        "api_key_env": "VLLM_KEY",
        "max_concurrent": 4,
        "options": {"timeout_ms": 5000},
        "capabilities": {"thinking": True},
    }
    cfg = provider_configs({"providers": {"vllm": raw}})["vllm"]
    assert (cfg.driver, cfg.dialect, cfg.base_url, cfg.api_key) == (
        "openai",
        "compat",
        "http://127.0.0.1:8000/v1",
        "sk-vllm",
    )
    assert (cfg.local, cfg.read_timeout_s, cfg.max_concurrent, cfg.capabilities) == (True, 5.0, 4, {"thinking": True})
    remote = provider_configs({"providers": {"far": {"base_url": "https://llm.example/v1"}}})["far"]
    assert not remote.local and remote.read_timeout_s == settings.LOOMCYCLE.provider_read_timeout_ms / 1000


def test_a_yaml_entry_tunes_a_built_in_of_the_same_id(settings: Any) -> None:
    keys = {**settings.LOOMCYCLE.provider_keys, "ANTHROPIC_API_KEY": "sk-ant"}
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, provider_keys=keys)
    cfg = provider_configs({"providers": {"anthropic": {"max_concurrent": 2}}})["anthropic"]
    assert (cfg.driver, cfg.api_key, cfg.base_url, cfg.max_concurrent) == (
        "anthropic",
        "sk-ant",
        settings.LOOMCYCLE.anthropic_base_url,
        2,
    )


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"x": {"base_url": "http://h/v1", "colour": "red"}}, "unknown fields"),
        ({"x": {"driver": "telepathy", "base_url": "http://h"}}, "unknown provider driver"),
        ({"x": {"driver": "openai"}}, "base_url is required"),
        ({"x": {"base_url": "http://h", "max_concurrent": -1}}, "max_concurrent"),
        ({"mock": {"base_url": "http://h"}}, "LOOMCYCLE_MOCK_"),
        ({"x": "not a mapping"}, "must be a mapping"),
    ],
)
def test_bad_entries_are_config_errors(block: dict[str, Any], message: str) -> None:
    with pytest.raises(Invalid, match=message) as caught:
        provider_configs({"providers": block})
    assert caught.value.code == "config_invalid"
