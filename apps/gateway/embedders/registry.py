"""Which embedder this process uses (`get_embedder()`), from configuration.

yaml `memory.embedder: {provider, model, base_url, api_key_env, dimensions,
timeout_ms, batch_size}` wins; without it, `LOOMCYCLE_EMBEDDER` names the
provider with its defaults ("hashing" by default; "none" = no embedder, the
API answers 503 embedder_not_configured).

`provider` is hashing, minilm, openai, gemini, voyage, ollama, anthropic
(= Voyage, which Anthropic points to: loomcycle's spelling, Voyage's key and
endpoint), or the id of any `providers:` entry or built-in provider whose
driver is openai, gemini or ollama (a local vLLM, `ollama-local`, ...).
Endpoint and key, highest first: the embedder's own `base_url` /
`api_key_env`; the chat provider of the same id (openai, gemini; `ollama`
uses `ollama-local`), so re-pointing `providers: ollama-local:` moves the
embedder too; the environment defaults (`*_BASE_URL`, `*_API_KEY`).

`dimensions` defaults to 384 (the memory vector column), 1024 for Voyage,
whose models cannot return 384. It is sent to the API (`dimensions`,
`outputDimensionality`, `output_dimension`) when set in yaml, and by
default to OpenAI's own endpoint and Gemini, which shorten any model's
vectors; other servers return their model's native size.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings

from apps.core.config import runtime_config
from apps.core.errors import Invalid
from apps.core.secrets import key_from_env
from apps.gateway.embedders.base import Embedder
from apps.gateway.embedders.hashing import MODEL as HASHING_MODEL
from apps.gateway.embedders.hashing import HashingEmbedder
from apps.gateway.embedders.http import (
    GeminiEmbedder,
    HttpEmbedder,
    HttpEmbedderConfig,
    OllamaEmbedder,
    OpenAIEmbedder,
    VoyageEmbedder,
)
from apps.gateway.embedders.minilm import MODEL as MINILM_MODEL
from apps.gateway.embedders.minilm import MiniLMEmbedder
from apps.gateway.providers.registry import provider_configs

FIELDS = frozenset({"provider", "model", "base_url", "api_key_env", "dimensions", "timeout_ms", "batch_size"})
OPENAI_OFFICIAL = "https://api.openai.com/v1"


@dataclass(frozen=True)
class HttpKind:
    cls: type[HttpEmbedder]
    model: str
    dimensions: int
    key_required: bool
    chat_id: str  # the chat provider whose endpoint and key it shares ("" = none)
    base_field: str  # the settings.LOOMCYCLE field with the default base URL
    key_env: str  # settings.LOOMCYCLE.provider_keys name of the default key ("" = none)


VOYAGE = HttpKind(VoyageEmbedder, "voyage-3.5-lite", 1024, True, "", "voyage_base_url", "VOYAGE_API_KEY")
KINDS = {
    "openai": HttpKind(
        OpenAIEmbedder, "text-embedding-3-small", 384, True, "openai", "openai_base_url", "OPENAI_API_KEY"
    ),
    "gemini": HttpKind(
        GeminiEmbedder, "gemini-embedding-001", 384, True, "gemini", "gemini_base_url", "GEMINI_API_KEY"
    ),
    "voyage": VOYAGE,
    "anthropic": VOYAGE,  # Anthropic has no embeddings API and sends users to Voyage (as loomcycle does)
    "ollama": HttpKind(OllamaEmbedder, "all-minilm", 384, False, "ollama-local", "ollama_base_url", ""),
}
DRIVER_KINDS = {"openai": "openai", "gemini": "gemini", "ollama": "ollama"}  # providers: driver -> kind


def _bad(message: str) -> Invalid:
    return Invalid(f"memory.embedder: {message}", code="config_invalid")


def embedder_spec(config: dict[str, Any]) -> dict[str, Any] | None:
    """The configured embedder as a yaml-shaped mapping, or None when there is none."""
    memory = config.get("memory") or {}
    if not isinstance(memory, dict):
        raise Invalid("memory: must be a mapping", code="config_invalid")
    raw = memory.get("embedder")
    if raw is None:
        name = settings.LOOMCYCLE.embedder.strip()
        return None if name.lower() in ("", "none") else {"provider": name}
    if isinstance(raw, str):
        raw = {"provider": raw}  # `embedder: hashing` shorthand
    if not isinstance(raw, dict):
        raise _bad("must be a mapping {provider, model, base_url, api_key_env, dimensions, timeout_ms, batch_size}")
    unknown = set(raw) - FIELDS
    if unknown:
        raise _bad(f"unknown fields {sorted(unknown)}")
    provider = str(raw.get("provider") or "").strip()
    if not provider:
        raise _bad("provider is required")
    return None if provider.lower() == "none" else {**raw, "provider": provider}


def _positive(spec: dict[str, Any], name: str, default: int) -> int:
    value = spec.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(f"{name} must be a positive integer, not {value!r}")
    return value


def _fixed_model(spec: dict[str, Any], model: str) -> None:
    if spec.get("model") not in (None, model):
        raise _bad(f'provider "{spec["provider"]}" always uses model {model}, not {spec["model"]!r}')


def build_embedder(spec: dict[str, Any], config: dict[str, Any]) -> Embedder:
    provider = str(spec["provider"])
    if provider == "hashing":
        _fixed_model(spec, HASHING_MODEL)
        return HashingEmbedder(dimensions=_positive(spec, "dimensions", 384))
    if provider == "minilm":
        _fixed_model(spec, MINILM_MODEL)
        if _positive(spec, "dimensions", 384) != 384:
            raise _bad("minilm vectors have 384 dimensions")
        return MiniLMEmbedder(batch_size=_positive(spec, "batch_size", settings.LOOMCYCLE.memory_embed_batch_size))
    chat = provider_configs(config)
    if provider in KINDS:
        kind = KINDS[provider]
        shared = chat.get(kind.chat_id) if kind.chat_id else None
        if shared is not None:
            base_url, key = shared.base_url, shared.api_key
        else:
            base_url = str(getattr(settings.LOOMCYCLE, kind.base_field))
            key = settings.LOOMCYCLE.provider_keys[kind.key_env] if kind.key_env else None
    elif provider in chat and chat[provider].driver in DRIVER_KINDS:
        kind = replace(KINDS[DRIVER_KINDS[chat[provider].driver]], key_required=False)
        base_url, key = chat[provider].base_url, chat[provider].api_key
    elif provider in chat:
        raise _bad(f'provider "{provider}" (driver {chat[provider].driver}) has no embeddings API')
    else:
        known = ", ".join(["hashing", "minilm", *KINDS, "none"])
        raise _bad(f'unknown provider "{provider}" (known: {known}, or a providers: id)')
    return kind.cls(_http_config(provider, spec, kind, base_url, key))


def _http_config(
    provider: str, spec: dict[str, Any], kind: HttpKind, base_url: str, key: str | None
) -> HttpEmbedderConfig:
    base_url = str(spec.get("base_url") or base_url).rstrip("/")
    if base_url.lower() in ("", "disabled"):
        raise _bad(f"{provider} has no endpoint (set base_url)")
    if spec.get("api_key_env"):
        key = key_from_env(str(spec["api_key_env"]))
    if key is None and kind.key_required and (kind.cls is not OpenAIEmbedder or base_url == OPENAI_OFFICIAL):
        raise _bad(f"{provider} needs an API key (its usual environment variable, or api_key_env)")
    return HttpEmbedderConfig(
        id=provider,
        model=str(spec.get("model") or kind.model),
        base_url=base_url,
        dimensions=_positive(spec, "dimensions", kind.dimensions),
        api_key=key,
        send_dimensions="dimensions" in spec or kind.cls is GeminiEmbedder or base_url == OPENAI_OFFICIAL,
        timeout_s=_positive(spec, "timeout_ms", settings.LOOMCYCLE.memory_embed_timeout_ms) / 1000.0,
        batch_size=_positive(spec, "batch_size", settings.LOOMCYCLE.memory_embed_batch_size),
    )


_CACHE: dict[str, Embedder] = {}
_LOCK = threading.Lock()


def get_embedder() -> Embedder | None:
    """This process's embedder (built once per configuration), or None when none is configured."""
    config = runtime_config()
    spec = embedder_spec(config)
    if spec is None:
        return None
    # Keyed by everything it is built from, so a changed configuration (tests, reload) gets its own instance.
    key = repr((spec, config.get("providers"), _env_inputs(spec)))
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = build_embedder(spec, config)
        return _CACHE[key]


def _env_inputs(spec: dict[str, Any]) -> tuple[Any, ...]:
    key_env = str(spec.get("api_key_env") or "")
    conf = settings.LOOMCYCLE
    return (
        sorted((name, value) for name, value in conf.provider_keys.items() if value),
        key_from_env(key_env) if key_env else None,
        (conf.openai_base_url, conf.gemini_base_url, conf.voyage_base_url, conf.ollama_base_url),
        (conf.memory_embed_batch_size, conf.memory_embed_timeout_ms),
    )
