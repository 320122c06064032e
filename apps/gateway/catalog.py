"""GET /v1/models: what the gateway's resolver can serve, in OpenAI's list shape, so tools that
list models before calling (Open WebUI, LiteLLM's proxy UI, the `openai` SDK's models.list())
work unchanged.

An id is a value the gateway's `model` field takes (apps.gateway.resolver): each alias of
`models:`, each "provider/model" named by a tier, a user tier or `defaults:`, whose provider is
configured in this process. Providers accept model names beyond these ("provider/<any>"); the list
is what the configuration names, not everything a provider could answer.
"""

from __future__ import annotations

from typing import Any

from apps.core.config import runtime_config
from apps.gateway.providers.registry import has_provider
from apps.gateway.resolver import Candidate, _aliases, _candidate


def served_models(config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """OpenAI `Model` objects, sorted by id, one per servable name."""
    config = runtime_config() if config is None else config
    aliases = _aliases(config)
    named: dict[str, Candidate] = {}
    for alias, raw in aliases.items():
        named[str(alias)] = _candidate(raw, {}, f"models.{alias}")
    for raw in _tier_entries(config):
        if isinstance(raw, str) and raw in aliases:
            continue  # listed under its alias above
        candidate = _candidate(raw, aliases, "tiers")
        named[f"{candidate.provider}/{candidate.model}"] = candidate
    defaults = config.get("defaults") or {}
    if isinstance(defaults, dict) and defaults.get("provider") and defaults.get("model"):
        named[f"{defaults['provider']}/{defaults['model']}"] = Candidate(
            str(defaults["provider"]), str(defaults["model"])
        )
    return [
        {"id": name, "object": "model", "created": 0, "owned_by": candidate.provider}
        for name, candidate in sorted(named.items())
        if has_provider(candidate.provider)
    ]


def _tier_entries(config: dict[str, Any]) -> list[Any]:
    """Every candidate entry of the library's `tiers:` and of each user tier's `tiers:`."""
    blocks = [config.get("tiers") or {}]
    blocks += [(user or {}).get("tiers") or {} for user in (config.get("user_tiers") or {}).values()]
    return [
        entry for block in blocks if isinstance(block, dict) for entries in block.values() for entry in entries or []
    ]
