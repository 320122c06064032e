"""A registration as the chains read it: an immutable snapshot of one row."""

from __future__ import annotations

from dataclasses import dataclass

from apps.triggers.models import HookFailMode, HookPhase, HookRegistration


def name_matches(pattern: str, name: str) -> bool:
    """Exact, `*`, or a trailing-`*` prefix (tools only; agents never carry a prefix glob)."""
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return pattern == name


@dataclass(frozen=True)
class Hook:
    hook_id: str
    tenant_id: str
    owner: str
    name: str
    phase: HookPhase
    agents: tuple[str, ...]
    tools: tuple[str, ...]
    callback_url: str
    fail_mode: HookFailMode
    timeout_ms: int

    @classmethod
    def of(cls, row: HookRegistration) -> Hook:
        return cls(
            hook_id=row.hook_id,
            tenant_id=row.tenant_id,
            owner=row.owner,
            name=row.name,
            phase=HookPhase(row.phase),
            agents=tuple(row.agents),
            tools=tuple(row.tools),
            callback_url=row.callback_url,
            fail_mode=HookFailMode(row.fail_mode),
            timeout_ms=row.timeout_ms,
        )

    def applies(self, *, tenant_id: str, agent: str, tool: str) -> bool:
        """A tenant's hook sees only that tenant's runs; a global one ("") sees all."""
        if self.tenant_id and self.tenant_id != tenant_id:
            return False
        agent_ok = any(a == "*" or a == agent for a in self.agents)
        return agent_ok and any(name_matches(t, tool) for t in self.tools)

    @property
    def label(self) -> str:
        return f"{self.owner}/{self.name}"
