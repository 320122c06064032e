"""What a run is given and does not act on, announced at run start (no silent
drops, issue 35): loomcycle's `capability_inert` event, one per field or knob.

Every field of SPEC's `POST /v1/runs` body and of the agent definition is in
exactly one of the `*_ACTED` sets (the runtime reads it) or the `*_INERT` maps
(stored, hashed, accepted, and announced when set); tests/runs/test_inert.py
fails on a field in neither. A sampling knob is announced per provider whose
API has no field for it (Provider.unsent_sampling), for every candidate of the
run's routing (a fallback may reach any of them).
"""

from __future__ import annotations

from typing import Any

from apps.gateway.providers.registry import get_provider, has_provider
from apps.runs.run_options import RunOptions

EVENT = "capability_inert"

# SPEC 2.3's POST /v1/runs fields the runtime reads.
REQUEST_ACTED = frozenset(
    {
        "agent", "segments", "prompt", "tools", "allowed_hosts", "session_id", "tenant_id", "user_id",
        "agent_id", "user_tier", "user_bearer", "user_credentials", "parent_context", "metadata",
        "interactive", "sampling", "compaction", "web_search_filter", "webhook",
    }
)  # fmt: skip
# field -> (the tool it would govern, why it does nothing here)
REQUEST_INERT = {
    "run_timeout_seconds": ("", "it bounds code-js agents, which this runtime does not run"),
}

# SPEC 5.1's AgentContent (and the yaml fields around it) the runtime reads.
AGENT_ACTED = frozenset(
    {
        "channels", "compaction", "description", "effort", "evaluation_scopes", "interruption",
        "max_concurrent_children", "max_iterations", "max_tokens", "memory_scopes", "model", "models", "name",
        "provider", "providers", "sampling", "system_prompt", "tier", "tools", "unbounded_iterations",
        "interactive", "skills", "disable_context", "volumes", "retry_attempts", "search_providers", "webhook",
        "history_scope",
    }
)  # fmt: skip
_NO_SQL = "this runtime has no SQL memory"
_NO_CORE = "this runtime has no core memory blocks"
AGENT_INERT = {
    "code_body": ("", "this runtime does not run code-js agents"),
    "run_timeout_seconds": ("", "it bounds code-js agents, which this runtime does not run"),
    "core_blocks": ("Memory", _NO_CORE),
    "inherit_core_blocks": ("Memory", _NO_CORE),
    "inject_tool_guide": ("Context", "no tool guide is injected into the system prompt"),
    "internal": ("", "agents are not hidden from listings by it"),
    "memory_backend": ("Memory", "memory is this runtime's Postgres store; no other backend is selected"),
    "memory_consolidation": ("Memory", "memory is not consolidated"),
    "memory_index_max_bytes": ("Memory", "no memory index is injected"),
    "memory_inject_max_tokens": ("Memory", "memory is not injected into the prompt"),
    "memory_protocol": ("Memory", "no memory protocol is injected into the prompt"),
    "memory_quota_bytes": ("Memory", "memory quotas are the operator's (per scope), not per agent"),
    "memory_roots": ("Memory", "memory paths are not rooted per agent"),
    "sql_quota_bytes": ("SQL", _NO_SQL),
    "sql_scopes": ("SQL", _NO_SQL),
}
COMPACTION_INERT = {"memory_flush": ("Memory", "compaction does not flush to memory")}


def _event(tool: str, gate: str, message: str, source: str) -> dict[str, Any]:
    return {"type": EVENT, EVENT: {"tool": tool, "gate": gate, "message": message, "source": source}}


def _is_set(value: Any) -> bool:
    return value is not None and value is not False and value != "" and value != [] and value != {}


def _fields(
    values: dict[str, Any], table: dict[str, tuple[str, str]], source: str, prefix: str = ""
) -> list[dict[str, Any]]:
    out = []
    for name, (tool, why) in table.items():
        if _is_set(values.get(name)):
            gate = f"{prefix}{name}"
            out.append(_event(tool, gate, f"{gate} is set on the {source} and not acted on: {why}", source))
    return out


def _sampling(routing: dict[str, Any]) -> list[dict[str, Any]]:
    """One event per knob some candidate provider does not send, naming those providers."""
    sampling, effort = routing.get("sampling") or {}, str(routing.get("effort") or "")
    lacking: dict[str, list[str]] = {}
    for cand in routing.get("candidates") or []:
        if not has_provider(cand["provider"]):
            continue  # the resolver refuses such a run; a restored one fails at its call
        for knob in get_provider(cand["provider"]).unsent_sampling(sampling, effort):
            lacking.setdefault(knob, []).append(f"{cand['provider']}/{cand['model']}")
    return [
        _event("", f"sampling.{knob}", f"sampling.{knob} is not sent to {', '.join(where)}: not in its API", "provider")
        for knob, where in sorted(lacking.items())
    ]


def inert_events(definition: dict[str, Any], options: RunOptions, routing: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's first events' `capability_inert` announcements (none when nothing is inert)."""
    return [
        *_fields(options.inert, REQUEST_INERT, "request"),
        *_fields(options.compaction, COMPACTION_INERT, "request", "compaction."),
        *_fields(definition, AGENT_INERT, "agent"),
        *_fields(definition.get("compaction") or {}, COMPACTION_INERT, "agent", "compaction."),
        *_sampling(routing),
    ]
