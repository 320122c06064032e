"""A schedule's per-run credentials (SPEC 9.1): `user_credentials_from_env`
({credential name: ENV_VAR}) resolved when the schedule fires.

Invariants:
- a variable is read only when its name is `LOOMCYCLE_*` or listed in
  `LOOMCYCLE_SCHEDULER_ENV_ALLOWLIST`, and never when it is one of the
  runtime's own infrastructure secrets; any other name, or a variable that is
  unset or empty, leaves that credential out;
- a credential named in `required_credentials` that is left out fails the
  fire (`CredentialMissing`): the run would otherwise start without it;
- values are never logged or put in an error: errors name the credential and
  the variable only. The run seals them (apps.runs.credentials).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from apps.core.secrets import key_from_env, name_refusal


class CredentialMissing(ValueError):
    """A required credential whose variable is not allowlisted, unset or empty."""


def env_allowed(name: str) -> bool:
    """Whether a schedule may read variable `name` as a credential."""
    if name_refusal(name, runtime=False) is not None:
        return False
    return name.startswith("LOOMCYCLE_") or name in settings.LOOMCYCLE.scheduler_env_allowlist


def schedule_credentials(definition: dict[str, Any]) -> dict[str, str]:
    """The run's credentials ({name: value}) from the definition's
    `user_credentials_from_env`; raises CredentialMissing for a required one."""
    out: dict[str, str] = {}
    missing: list[str] = []
    for cred, var in (definition.get("user_credentials_from_env") or {}).items():
        value = key_from_env(var) if env_allowed(var) else None
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
            + " (the variable must be set, non-empty, and LOOMCYCLE_* or in LOOMCYCLE_SCHEDULER_ENV_ALLOWLIST)"
        )
    return out
