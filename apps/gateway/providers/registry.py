"""Which providers this process can call (SPEC 7.2).

Built-ins are enabled by their environment: `anthropic` (ANTHROPIC_API_KEY),
`openai` (OPENAI_API_KEY), `deepseek` (DEEPSEEK_API_KEY), `gemini`
(GEMINI_API_KEY), `ollama` (OLLAMA_API_KEY, Ollama cloud), `ollama-local`
(on unless OLLAMA_BASE_URL=disabled), `mock`/`mock-stable`
(LOOMCYCLE_MOCK_ENABLED; on by default for the embedded default only). The
yaml `providers:` block adds endpoints
(`{driver, dialect, base_url, api_key_env, max_concurrent, options,
capabilities}`) or tunes a built-in of the same id.
"""

from __future__ import annotations

import importlib
import ipaddress
import logging
from functools import cache
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from apps.core.config import runtime_config
from apps.core.errors import Invalid
from apps.core.secrets import key_from_env
from apps.gateway.providers.base import Provider
from apps.gateway.providers.http import HttpProvider, ProviderConfig, WireProtocol
from apps.gateway.providers.mock import MockProvider

log = logging.getLogger("loomcycle.gateway")

# driver name -> "module:class" of its WireProtocol
DRIVERS = {
    "anthropic": "apps.gateway.providers.anthropic:AnthropicProtocol",
    "openai": "apps.gateway.providers.openai:OpenAIProtocol",
    "gemini": "apps.gateway.providers.gemini:GeminiProtocol",
    "ollama": "apps.gateway.providers.ollama:OllamaProtocol",
}


def protocol_for(driver: str) -> WireProtocol:
    try:
        module, _, cls = DRIVERS[driver].partition(":")
    except KeyError:
        raise Invalid(
            f'unknown provider driver "{driver}" (known: {", ".join(sorted(DRIVERS))})', code="config_invalid"
        ) from None
    protocol: WireProtocol = getattr(importlib.import_module(module), cls)()
    return protocol


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _timeouts(local: bool, options: dict[str, Any]) -> tuple[float, float]:
    conf = settings.LOOMCYCLE
    read_ms = conf.local_provider_read_timeout_ms if local else conf.provider_read_timeout_ms
    read_ms = int(options.get("timeout_ms", read_ms))
    connect_ms = int(options.get("connect_timeout_ms", conf.provider_connect_timeout_ms))
    return connect_ms / 1000.0, read_ms / 1000.0


def builtin_configs() -> dict[str, ProviderConfig]:
    conf = settings.LOOMCYCLE
    keys = conf.provider_keys
    wanted: list[tuple[str, str, str, str | None, str, bool]] = []  # id, driver, base, key, dialect, local
    if keys["ANTHROPIC_API_KEY"]:
        wanted.append(("anthropic", "anthropic", conf.anthropic_base_url, keys["ANTHROPIC_API_KEY"], "", False))
    if keys["OPENAI_API_KEY"]:
        wanted.append(("openai", "openai", conf.openai_base_url, keys["OPENAI_API_KEY"], "openai", False))
    if keys["DEEPSEEK_API_KEY"]:
        wanted.append(("deepseek", "openai", conf.deepseek_base_url, keys["DEEPSEEK_API_KEY"], "deepseek", False))
    if keys["GEMINI_API_KEY"]:
        wanted.append(("gemini", "gemini", conf.gemini_base_url, keys["GEMINI_API_KEY"], "", False))
    if keys["OLLAMA_API_KEY"]:
        wanted.append(("ollama", "ollama", conf.ollama_cloud_base_url, keys["OLLAMA_API_KEY"], "", False))
    if conf.ollama_base_url.strip().lower() != "disabled":
        wanted.append(("ollama-local", "ollama", conf.ollama_base_url, None, "", True))
    out: dict[str, ProviderConfig] = {}
    for pid, driver, base, key, dialect, local in wanted:
        connect_s, read_s = _timeouts(local, {})
        out[pid] = ProviderConfig(
            id=pid,
            driver=driver,
            base_url=base.rstrip("/"),
            api_key=key,
            dialect=dialect,
            local=local,
            connect_timeout_s=connect_s,
            read_timeout_s=read_s,
        )
    return out


def yaml_config(pid: str, raw: Any, base: ProviderConfig | None) -> ProviderConfig:
    """A `providers:` entry, on top of the built-in of the same id if there is one."""
    if not isinstance(raw, dict):
        raise Invalid(f"providers.{pid}: must be a mapping", code="config_invalid")
    unknown = set(raw) - {"driver", "dialect", "base_url", "api_key_env", "max_concurrent", "options", "capabilities"}
    if unknown:
        raise Invalid(f"providers.{pid}: unknown fields {sorted(unknown)}", code="config_invalid")
    driver = str(raw.get("driver") or (base.driver if base else "openai"))
    protocol_for(driver)  # unknown driver -> config error now
    base_url = str(raw.get("base_url") or (base.base_url if base else "")).rstrip("/")
    if not base_url:
        raise Invalid(f"providers.{pid}: base_url is required", code="config_invalid")
    api_key = base.api_key if base else None
    if raw.get("api_key_env"):
        api_key = key_from_env(str(raw["api_key_env"]))
        if api_key is None:
            log.warning("providers.%s: %s is not set; calls will go without a key", pid, raw["api_key_env"])
    options = dict(raw.get("options") or {})
    local = bool(options.get("local", _is_loopback(base_url)))
    connect_s, read_s = _timeouts(local, options)
    max_concurrent = raw.get("max_concurrent", base.max_concurrent if base else 0)
    if not isinstance(max_concurrent, int) or max_concurrent < 0:
        raise Invalid(f"providers.{pid}: max_concurrent must be a non-negative integer", code="config_invalid")
    return ProviderConfig(
        id=pid,
        driver=driver,
        base_url=base_url,
        api_key=api_key,
        dialect=str(raw.get("dialect") or (base.dialect if base else ("compat" if driver == "openai" else ""))),
        local=local,
        connect_timeout_s=connect_s,
        read_timeout_s=read_s,
        max_concurrent=max_concurrent,
        options=options,
        capabilities=dict(raw.get("capabilities") or {}),
    )


def provider_configs(config: dict[str, Any]) -> dict[str, ProviderConfig]:
    out = builtin_configs()
    block = config.get("providers") or {}
    if not isinstance(block, dict):
        raise Invalid("providers: must be a mapping of id -> provider", code="config_invalid")
    for pid, raw in block.items():
        if pid in ("mock", "mock-stable"):
            raise Invalid(
                f"providers.{pid}: the mock provider is configured by LOOMCYCLE_MOCK_*", code="config_invalid"
            )
        out[str(pid)] = yaml_config(str(pid), raw, out.get(str(pid)))
    return out


@cache
def _providers() -> dict[str, Provider]:
    found: dict[str, Provider] = {}
    if settings.LOOMCYCLE.mock_enabled:
        found["mock"] = MockProvider("mock")
        found["mock-stable"] = MockProvider("mock-stable", stable=True)
    for pid, cfg in provider_configs(runtime_config()).items():
        found[pid] = HttpProvider(cfg, protocol_for(cfg.driver))
    return found


def provider_ids() -> list[str]:
    return sorted(_providers())


def has_provider(provider_id: str) -> bool:
    return provider_id in _providers()


def get_provider(provider_id: str) -> Provider:
    try:
        return _providers()[provider_id]
    except KeyError:
        raise Invalid(
            f'unknown provider "{provider_id}" (available: {", ".join(provider_ids()) or "none"})',
            code="unknown_provider",
        ) from None
