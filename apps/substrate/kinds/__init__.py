"""The definition kinds: for each, its models, tool name, ops, how a definition is
validated and normalised, and how its content hash is taken (base.py: what a kind is).

The agent-callable kinds (agent.py: AgentDef, skill.py: SkillDef) and the admin-plane ones
(mcp.py: MCPServerDef, schedule.py: ScheduleDef, webhook.py: WebhookDef, a2a.py: A2AServerCardDef and
A2AAgentDef), which are never
agent-callable (SPEC 6.5) and authored over REST, admin or yaml only. Each module builds its
`Kind` without side effects; `KINDS` below lists them, the one registry. Only validation lives
here: the ops beyond the shared ones (ScheduleDef's hooks, apps.substrate.hookops; MCPServerDef's
discovery, apps.mcp) are registered with the services (`def_ops_register`) at ready().
"""

from __future__ import annotations

from apps.substrate.kinds.a2a import A2A_AGENT, A2A_SERVER_CARD
from apps.substrate.kinds.agent import AGENT, normalise_agent
from apps.substrate.kinds.base import (
    REFUSALS,
    VERSIONED_OPS,
    Kind,
    Refusal,
    Refused,
    RefusedNotFound,
    check_def_name,
    refusal_details,
    string_list,
)
from apps.substrate.kinds.mcp import MCPSERVER
from apps.substrate.kinds.schedule import SCHEDULE
from apps.substrate.kinds.skill import SKILL
from apps.substrate.kinds.webhook import WEBHOOK

__all__ = [
    "KINDS",
    "REFUSALS",
    "VERSIONED_OPS",
    "Kind",
    "Refusal",
    "Refused",
    "RefusedNotFound",
    "check_def_name",
    "get_kind",
    "normalise_agent",
    "refusal_details",
    "string_list",
]

KINDS: dict[str, Kind] = {
    kind.key: kind for kind in (AGENT, SKILL, MCPSERVER, SCHEDULE, WEBHOOK, A2A_SERVER_CARD, A2A_AGENT)
}


def get_kind(key: str) -> Kind:
    return KINDS[key]
