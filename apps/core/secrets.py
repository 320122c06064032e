"""Secret references: `${NAME}` (or `${NAME:-fallback}`) naming an environment
variable, kept as written in secret-bearing fields (MCP server `headers` and
`env`) and resolved only where the value is used.

A definition row, its content hash, a REST/admin/tool answer and a snapshot
therefore carry the reference, never the value: every tenant may read the
shared rows, so a resolved value stored there would be readable by all.

`INFRA_SECRET_NAMES` are the runtime's own secrets. No reference, `*_env`
field or credential name may name one: a definition that could send the
database URL, the token pepper or a provider key to a server of the author's
choosing would hand them to whoever may write a definition.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import environ

# The same name shape loomcycle.yaml expansion uses (SPEC C.1). `${run.user_bearer}`
# and `${run.credentials.x}` have a dot, so they never match: they are request-time
# placeholders of the MCP client, not environment references.
REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

# The provider API keys the runtime reads (loomcycle_project.env reads exactly these).
PROVIDER_KEY_NAMES = (
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "DEEPSEEK_API_KEY",
    "GEMINI_API_KEY",
    "OLLAMA_API_KEY",
    "VOYAGE_API_KEY",
    "BRAVE_API_KEY",  # the WebSearch tool's hosted backend (apps.tools.search_backends)
)

INFRA_SECRET_NAMES = frozenset(
    {
        *PROVIDER_KEY_NAMES,
        "DATABASE_URL",
        "REDIS_URL",
        "DJANGO_SECRET_KEY",
        "LOOMCYCLE_AUTH_TOKEN",
        "LOOMCYCLE_OPERATOR_TOKEN_PEPPER",
        "LOOMCYCLE_FLOWER_BASIC_AUTH",
        "FLOWER_BASIC_AUTH",
        "LOOMCYCLE_PG_DSN",
        "PG_DSN",
        # The CLI's admin credential and address: `init --with-token` and docs/operations.md put
        # them into the shell that starts `make run`, so every runtime process inherits them.
        "LOOMCYCLE_TOKEN",
        "LOOMCYCLE_URL",
    }
)

# A runtime-authored definition (REST, admin, tool) may reference only the
# runtime's own namespace, as loomcycle's ExpandEnvAllowed does; operator yaml any name.
RUNTIME_REF_PREFIX = "LOOMCYCLE_"


def config_secret_names(config: dict[str, Any]) -> set[str]:
    """The key variables a loomcycle.yaml names (`providers.*.api_key_env`,
    `memory.embedder.api_key_env`): provider keys too, so denied like the fixed set."""
    names: set[str] = set()
    providers = config.get("providers")
    for raw in providers.values() if isinstance(providers, dict) else ():
        if isinstance(raw, dict) and isinstance(raw.get("api_key_env"), str):
            names.add(raw["api_key_env"])
    memory = config.get("memory")
    embedder = memory.get("embedder") if isinstance(memory, dict) else None
    if isinstance(embedder, dict) and isinstance(embedder.get("api_key_env"), str):
        names.add(embedder["api_key_env"])
    return names


_ENV = environ.Env()


def key_from_env(name: str) -> str | None:
    """The value of the variable a configuration names as a key source
    (`api_key_env`), read where it is used; None when unset or empty. The name
    comes from yaml, so it cannot be read ahead into Django settings; django-environ
    reads it as loomcycle_project.env reads the fixed keys (`$OTHER` proxies OTHER)."""
    value: str | None = _ENV.str(name, default=None)
    return value or None


def referenced_names(text: str) -> list[str]:
    return [m.group(1) for m in REF_RE.finditer(text)]


def name_refusal(name: str, *, runtime: bool, denied: Iterable[str] = ()) -> str | None:
    """Why `name` may not be referenced (or used as a credential source), or None."""
    if name in INFRA_SECRET_NAMES or name in set(denied):
        return f"{name} is one of the runtime's own infrastructure secrets and cannot be referenced"
    if runtime and not name.startswith(RUNTIME_REF_PREFIX):
        return f"{name}: a runtime definition may reference only {RUNTIME_REF_PREFIX}* variables"
    return None


def credential_env_refusal(
    name: str,
    *,
    tenant_id: str,
    tenant_allowlist: Mapping[str, tuple[str, ...]],
    shared_allowlist: Iterable[str] = (),
) -> str | None:
    """Why a trigger row owned by `tenant_id` ("" for the shared tenant) may not read variable
    `name` as a run credential, or None. The environment is one namespace shared by every
    tenant: a tenant's own row reads only what the operator listed for that tenant
    (`tenant_allowlist`, LOOMCYCLE_TENANT_CREDENTIAL_ENV; `LOOMCYCLE_*` is no licence: another
    tenant's webhook secret is named so); a shared row `LOOMCYCLE_*` or `shared_allowlist`.
    Never an infrastructure secret."""
    refusal = name_refusal(name, runtime=False)
    if refusal is not None:
        return refusal
    if tenant_id:
        if name in tenant_allowlist.get(tenant_id, ()):
            return None
        return (
            f"{name}: a tenant's definition may read only the variables the operator lists for its tenant "
            f"in LOOMCYCLE_TENANT_CREDENTIAL_ENV ({tenant_id}:{name})"
        )
    if name.startswith(RUNTIME_REF_PREFIX) or name in set(shared_allowlist):
        return None
    return f"{name}: not {RUNTIME_REF_PREFIX}* nor in the operator's allowlist"


def resolve_references(text: str, *, runtime: bool, denied: Iterable[str] = ()) -> str:
    """`text` with each `${NAME}` replaced by the variable's value ("" when
    unset; `${NAME:-fb}` gives fb when unset or empty). Raises ValueError for a
    name `name_refusal` refuses: checked again here, not only at write time,
    so a row written before a name was denied still cannot leak it."""
    deny = set(denied)

    def substitute(match: re.Match[str]) -> str:
        refusal = name_refusal(match.group(1), runtime=runtime, denied=deny)
        if refusal:
            raise ValueError(refusal)
        value = os.environ.get(match.group(1), "")
        return match.group(2) if match.group(2) is not None and value == "" else value

    return REF_RE.sub(substitute, text)
