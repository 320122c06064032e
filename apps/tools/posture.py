"""The two postures of SPEC 8, derived from the settings (there is no posture
switch: the environment that configures each tool decides it, as in loomcycle).

- managed-sandbox: every world tool is default-deny: the network reaches only a
  caller's `allowed_hosts` (LOOMCYCLE_HTTP_CALLER_AUTHORITATIVE=1), or nothing.
- agentic-dev: the network reaches any public host (`*` in
  LOOMCYCLE_HTTP_HOST_ALLOWLIST).
- custom: anything between.

Apps that contribute world tools describe them with `stance_register` (from
AppConfig.ready); the posture holds when every stance agrees with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from django.conf import settings

from apps.core import hosts


class Posture(StrEnum):
    MANAGED_SANDBOX = "managed-sandbox"
    AGENTIC_DEV = "agentic-dev"
    CUSTOM = "custom"


@dataclass(frozen=True)
class ToolStance:
    """What one built-in tool is allowed to do under the current settings."""

    tool: str
    allows: str  # for humans (doctor)
    sandboxed: bool  # consistent with managed-sandbox
    dev: bool  # consistent with agentic-dev


_STANCES: list[Callable[[], list[ToolStance]]] = []


def stance_register(describe: Callable[[], list[ToolStance]]) -> None:
    if describe not in _STANCES:
        _STANCES.append(describe)


def stances() -> list[ToolStance]:
    return [stance for describe in _STANCES for stance in describe()]


def posture() -> Posture:
    found = stances()
    if found and all(s.sandboxed for s in found):
        return Posture.MANAGED_SANDBOX
    if found and all(s.dev for s in found):
        return Posture.AGENTIC_DEV
    return Posture.CUSTOM


def network_stances() -> list[ToolStance]:
    """HTTP and WebFetch under the LOOMCYCLE_HTTP_* settings."""
    conf = settings.LOOMCYCLE
    operator = tuple(conf.http_host_allowlist)
    private = tuple(conf.http_private_host_allowlist)
    if not hosts.network_configured():
        allows = "refuses every call: not configured (LOOMCYCLE_HTTP_HOST_ALLOWLIST is empty)"
    elif conf.http_caller_authoritative:
        within = f" within {', '.join(operator)}" if operator else ""
        allows = f"only the hosts each run's caller lists in allowed_hosts{within}; none when omitted"
    else:
        allows = f"{', '.join(operator)} (a caller's allowed_hosts narrows it)"
    allows += "; non-public addresses refused" + (f" except for {', '.join(private)}" if private else "")
    sandboxed = not hosts.network_configured() or bool(conf.http_caller_authoritative)
    dev = "*" in operator and not conf.http_caller_authoritative
    return [ToolStance(tool, allows, sandboxed, dev) for tool in ("HTTP", "WebFetch")]
