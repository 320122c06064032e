"""What a caller may reach over A2A, and the agent cards that say so.

Exposure and audience come from A2AServerCardDefs: a tenant's own cards expose agents to
that tenant's tokens only; the shared tenant's cards (operator yaml or runtime) expose
agents to every caller, and the run still belongs to the caller's tenant (an agent name
resolves as for POST /v1/runs). A caller without a token sees the shared cards' skills
only, so a card fetch reveals no tenant's definitions. Where two cards name one skill id,
the caller's own tenant's card wins, then the card whose name sorts first.
"""

from __future__ import annotations

from dataclasses import dataclass

from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentProvider, AgentSkill
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol
from django.db import connection

import loomcycle_project
from apps.substrate.kinds import get_kind
from apps.substrate.selectors import defs_visible

JSONRPC_PATH = "/a2a/jsonrpc"
AGENT_PREFIX = "/a2a/agents/"
RUNTIME_NAME = "loomcycle"


@dataclass(frozen=True)
class Exposed:
    """One agent a caller may reach: its skill, and the card definition that exposes it."""

    skill_id: str
    agent_name: str
    card_name: str
    skill_name: str
    description: str
    tags: tuple[str, ...]
    input_modes: tuple[str, ...]
    output_modes: tuple[str, ...]
    streaming: bool
    push_notifications: bool


def exposed_for(tenant_id: str | None) -> dict[str, Exposed]:
    """skill id -> what it reaches, for a caller of `tenant_id` (None: no token, shared cards only)."""
    try:
        rows = defs_visible(get_kind("a2aservercard"), tenant_id=tenant_id or "")
    finally:
        connection.close()
    ordered = sorted(rows.values(), key=lambda row: (row.tenant_id != (tenant_id or ""), row.name))
    out: dict[str, Exposed] = {}
    for row in ordered:
        caps = row.definition.get("capabilities") or {}
        for entry in row.definition.get("exposed_agents") or []:
            out.setdefault(entry["skill_id"], _exposed(row.name, entry, caps))
    return out


def _exposed(card_name: str, entry: dict[str, object], caps: dict[str, bool]) -> Exposed:
    def strings(key: str) -> tuple[str, ...]:
        value = entry.get(key)
        return tuple(str(v) for v in value) if isinstance(value, list) else ()

    return Exposed(
        skill_id=str(entry["skill_id"]),
        agent_name=str(entry["agent_name"]),
        card_name=card_name,
        skill_name=str(entry.get("skill_name") or entry["agent_name"]),
        description=str(entry.get("description") or ""),
        tags=strings("tags"),
        input_modes=strings("input_modes"),
        output_modes=strings("output_modes"),
        streaming=bool(caps.get("streaming", True)),
        push_notifications=bool(caps.get("push_notifications", False)),
    )


def _skill(e: Exposed) -> AgentSkill:
    return AgentSkill(
        id=e.skill_id,
        name=e.skill_name,
        description=e.description or f"the {e.agent_name} agent",
        tags=list(e.tags) or [e.agent_name],
        input_modes=list(e.input_modes),
        output_modes=list(e.output_modes),
    )


def _card(name: str, description: str, url: str, skills: list[Exposed]) -> AgentCard:
    return AgentCard(
        name=name,
        description=description,
        version=loomcycle_project.__version__,
        provider=AgentProvider(organization=RUNTIME_NAME, url=url),
        supported_interfaces=[
            AgentInterface(
                url=url, protocol_binding=TransportProtocol.JSONRPC.value, protocol_version=PROTOCOL_VERSION_CURRENT
            )
        ],
        capabilities=AgentCapabilities(
            streaming=any(e.streaming for e in skills) or not skills,
            push_notifications=any(e.push_notifications for e in skills),
        ),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[_skill(e) for e in skills],
    )


def runtime_card(base_url: str, exposed: dict[str, Exposed]) -> AgentCard:
    """The runtime's card: every skill the caller may reach, at the shared JSON-RPC endpoint
    (a message names its skill in `metadata.skillId` when there is more than one)."""
    skills = list(exposed.values())
    return _card(RUNTIME_NAME, "agents hosted by this loomcycle runtime", base_url + JSONRPC_PATH, skills)


def agent_card(base_url: str, exposed: Exposed) -> AgentCard:
    """One exposed agent's card: its own JSON-RPC endpoint, where no skill id is needed."""
    url = f"{base_url}{AGENT_PREFIX}{exposed.skill_id}/jsonrpc"
    return _card(exposed.skill_name, exposed.description or f"the {exposed.agent_name} agent", url, [exposed])
