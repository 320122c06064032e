"""Rules for a kind's secret-bearing fields (`Kind.secret_fields`, string maps
such as MCP server `headers` and `env`) that every def op follows:

- only the shared tenant's rows (yaml, or written by an operator) may hold
  `${NAME}` references: the environment belongs to the operator, and a tenant
  that could name a variable could have it sent to a server of its choosing;
- a tenant-owned ScheduleDef or WebhookDef reads as credentials only the
  variables the operator lists for that tenant (LOOMCYCLE_TENANT_CREDENTIAL_ENV);
- a reader who does not own a row (a tenant reading a shared row) sees the
  references of a value as written (`Bearer ${LOOMCYCLE_X}`: a name, not a
  secret) and every literal part masked (a literal beside a reference, a
  `${NAME:-fallback}` fallback), save an auth scheme word; a tenant forking a shared row starts
  from that masked copy, so a fork never copies a literal secret either.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

from apps.core.secrets import REF_RE, credential_env_refusal, referenced_names
from apps.substrate.kinds.base import Kind, Refused

MASKED = "[redacted]"


def check_tenant_refs(tenant_id: str, name: str, fields: dict[str, Any]) -> None:
    """Refuse `${NAME}` references in a tenant-owned row's secret fields."""
    if not tenant_id:
        return
    for field, value in fields.items():
        for key, text in (value or {}).items():
            names = referenced_names(text) if isinstance(text, str) else []
            if names:
                raise Refused(
                    f"{name!r}: {field}.{key} references ${{{names[0]}}}: a tenant's definition may not "
                    "reference environment variables; put the value itself in the field"
                )


def check_definition(kind: Kind, tenant_id: str, name: str, definition: dict[str, Any]) -> None:
    check_tenant_refs(tenant_id, name, {f: definition.get(f) for f in kind.secret_fields})
    if tenant_id:  # the shared tenant's rows: checked by name when the trigger fires
        names = {k: v for field in kind.credential_env_fields for k, v in _env_names(definition, field).items()}
        check_tenant_credential_env(tenant_id, name, names)


def _env_names(definition: dict[str, Any], field: str) -> dict[str, str]:
    """{where: VARIABLE} of one `Kind.credential_env_fields` entry: a map's values, or `a.b`."""
    head, _, leaf = field.partition(".")
    value = definition.get(head)
    if not isinstance(value, dict):
        return {}
    if not leaf:
        return {f"{head}.{k}": str(v) for k, v in value.items()}
    return {field: value[leaf]} if isinstance(value.get(leaf), str) and value[leaf] else {}


def check_tenant_credential_env(tenant_id: str, name: str, names: dict[str, str]) -> None:
    """Refuse a tenant-owned trigger row naming ({where: VARIABLE}) a variable the operator
    has not listed for that tenant (apps.core.secrets.credential_env_refusal)."""
    allowlist = settings.LOOMCYCLE.tenant_credential_env
    for where, variable in names.items():
        refusal = credential_env_refusal(variable, tenant_id=tenant_id, tenant_allowlist=allowlist)
        if refusal:
            raise Refused(f"{name!r}: {where}: {refusal}")


# Literal text a reader may see beside a reference: an auth scheme word, never a secret.
_SCHEME_RE = re.compile(r"(?i)(bearer|basic|token|bot)\s+")


def _mask(value: Any) -> str:
    """A value as a non-owner sees it: its references as written, every literal
    part masked (a `${NAME:-fallback}` fallback too), save an auth scheme word."""
    if not isinstance(value, str) or not REF_RE.search(value):
        return MASKED
    out, pos = [], 0
    for ref in REF_RE.finditer(value):
        out.append(_mask_literal(value[pos : ref.start()]))
        out.append(f"${{{ref.group(1)}:-{MASKED}}}" if ref.group(2) else f"${{{ref.group(1)}}}")
        pos = ref.end()
    out.append(_mask_literal(value[pos:]))
    return "".join(out)


def _mask_literal(text: str) -> str:
    return text if not text or _SCHEME_RE.fullmatch(text) else MASKED


def redacted(kind: Kind, definition: dict[str, Any]) -> dict[str, Any]:
    """`definition` with the literal values of its secret fields masked."""
    out = dict(definition)
    for field in kind.secret_fields:
        if isinstance(out.get(field), dict):
            out[field] = {k: _mask(v) for k, v in out[field].items()}
    return out
