"""Who may use the operator's privileged tools: Bash, and the host tools of the deployment's
own code (apps.runs.hosttools). Both run on the workers' host with what the operator gave
them, so they are the operator's, not every tenant's:

- an agent of the operator's yaml (a static row of the shared tenant) may use them, whoever
  runs it: the operator wrote it;
- so may any agent of a tenant LOOMCYCLE_BASH_TENANTS lists (`*`: every tenant, for
  single-tenant or development installs);
- nobody else. A definition naming one is refused when it is written (apps.substrate.services,
  for the tenant it lands in), and a run never gets one it may not use: its tools are narrowed
  when it is created (apps.runs.services) and again at every tool batch (apps.runs.engine), so a
  row or run written before this rule does not keep one.

The registry marks a tool privileged when it is registered (`Tool.operator_only`).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings

_NAMES: set[str] = set()

SETTING = "LOOMCYCLE_BASH_TENANTS"


def mark(name: str) -> None:
    _NAMES.add(name)


def is_privileged(name: str) -> bool:
    return name in _NAMES


def tenant_listed(tenant_id: str) -> bool:
    listed = settings.LOOMCYCLE.bash_tenants
    return "*" in listed or (bool(tenant_id) and tenant_id in listed)


def may_use(*, tenant_id: str, operator_yaml: bool) -> bool:
    """Whether a run of this agent may use privileged tools."""
    return operator_yaml or tenant_listed(tenant_id)


def narrowed(tools: Iterable[str], *, tenant_id: str, operator_yaml: bool) -> list[str]:
    """`tools` without the privileged ones this agent may not use."""
    if may_use(tenant_id=tenant_id, operator_yaml=operator_yaml):
        return list(tools)
    return [name for name in tools if not is_privileged(name)]


def refusal(names: Iterable[str], *, tenant_id: str) -> str | None:
    """Why a definition written for `tenant_id` (not from the operator's yaml) may not name these tools."""
    if tenant_listed(tenant_id):
        return None
    named = sorted({n for n in names if isinstance(n, str) and is_privileged(n)})
    if not named:
        return None
    who = f"tenant {tenant_id!r}" if tenant_id else "the shared tenant (outside the operator's yaml)"
    return (
        f"tools {named} may be used only by agents of the operator's yaml or by tenants listed in "
        f"{SETTING}; {who} is not listed"
    )
