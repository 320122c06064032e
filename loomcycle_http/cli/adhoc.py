"""loom's ad-hoc form: `--model PREFIX/MODEL --system ...` becomes a runtime AgentDef.

Invariants:
- The agent's name is derived from its content (`adhoc-<12 hex of sha256>`), so the same
  model, system prompt and tools name the same agent: applying it again is a no-op
  (`deduplicated`), and a change is a new agent, versioned and hashed like any other.
- A prefix is mapped onto the runtime's provider names by PROVIDER_PREFIXES; an unknown
  prefix is passed through unchanged (a provider the operator's yaml names).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import click

from loomcycle_http.client import Client

# loom's prefixes → this runtime's providers (docs/cli.md lists them).
PROVIDER_PREFIXES = {
    "anthropic": "anthropic",
    "claude": "anthropic",
    "openai": "openai",
    "deepseek": "deepseek",
    "gemini": "gemini",
    "google": "gemini",
    "ollama": "ollama-local",
    "ollama-cloud": "ollama",
    "mock": "mock",
    "mock-stable": "mock-stable",
}


def provider_and_model(spec: str) -> tuple[str, str]:
    """`ollama/qwen3:8b` → (`ollama-local`, `qwen3:8b`)."""
    prefix, sep, model = spec.partition("/")
    if not sep or not prefix or not model:
        raise click.UsageError(f"--model {spec!r}: expected PROVIDER/MODEL, e.g. ollama/qwen3:8b")
    return PROVIDER_PREFIXES.get(prefix, prefix), model


def definition(spec: str, system: str, tools: list[str]) -> dict[str, Any]:
    provider, model = provider_and_model(spec)
    found: dict[str, Any] = {"provider": provider, "model": model, "tools": tools}
    if system:
        found["system_prompt"] = system
    return found


def adhoc_name(found: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()
    return f"adhoc-{digest[:12]}"


def ensure_agent(client: Client, spec: str, system: str, tools: list[str]) -> dict[str, Any]:
    """The AgentDef row of the ad-hoc agent (created on first use)."""
    found = definition(spec, system, tools)
    return client.agents.apply(adhoc_name(found), found, description=f"ad-hoc: loomcycle run --model {spec}")
