"""A schedule's per-run credentials (SPEC 9.1): `user_credentials_from_env`
({credential name: ENV_VAR}) resolved when the schedule fires.

Invariants:
- a shared row (the operator's) reads a variable only when its name is
  `LOOMCYCLE_*` or listed in `LOOMCYCLE_SCHEDULER_ENV_ALLOWLIST`; a tenant's own
  row only the variables LOOMCYCLE_TENANT_CREDENTIAL_ENV lists for its tenant
  (checked again here, not only at write time, so a row written before the rule
  cannot read another tenant's secret); never one of the runtime's own
  infrastructure secrets. Any other name, or a variable that is unset or empty,
  leaves that credential out;
- a credential named in `required_credentials` that is left out fails the
  fire (`CredentialMissing`): the run would otherwise start without it;
- values are never logged or put in an error: errors name the credential and
  the variable only. The run seals them (apps.runs.credentials).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from apps.core.secrets import credential_env_refusal, key_from_env


class CredentialMissing(ValueError):
    """A required credential whose variable is not allowlisted, unset or empty."""


def env_allowed(name: str, *, tenant_id: str) -> bool:
    """Whether a schedule owned by `tenant_id` may read variable `name` as a credential."""
    runtime = settings.LOOMCYCLE
    refusal = credential_env_refusal(
        name,
        tenant_id=tenant_id,
        tenant_allowlist=runtime.tenant_credential_env,
        shared_allowlist=runtime.scheduler_env_allowlist,
    )
    return refusal is None


def schedule_credentials(definition: dict[str, Any], *, tenant_id: str) -> dict[str, str]:
    """The run's credentials ({name: value}) from the definition's
    `user_credentials_from_env`; raises CredentialMissing for a required one."""
    out: dict[str, str] = {}
    missing: list[str] = []
    for cred, var in (definition.get("user_credentials_from_env") or {}).items():
        value = key_from_env(var) if env_allowed(var, tenant_id=tenant_id) else None
        if value is None:
            missing.append(f"{cred} (from {var})")
            continue
        out[cred] = value
    required = [c for c in definition.get("required_credentials") or [] if c not in out]
    if required:
        unresolved = [m for m in missing if m.split(" ", 1)[0] in required]
        raise CredentialMissing(
            "required credentials not resolvable: "
            + ", ".join(unresolved or required)
            + " (the variable must be set, non-empty, and "
            + (
                f"listed for tenant {tenant_id} in LOOMCYCLE_TENANT_CREDENTIAL_ENV)"
                if tenant_id
                else "LOOMCYCLE_* or in LOOMCYCLE_SCHEDULER_ENV_ALLOWLIST)"
            )
        )
    return out
