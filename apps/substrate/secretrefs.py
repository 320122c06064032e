"""Rules for a kind's secret-bearing fields (`Kind.secret_fields`, string maps
such as MCP server `headers` and `env`) that every def op follows:

- only the shared tenant's rows (yaml, or written by an operator) may hold
  `${NAME}` references: the environment belongs to the operator, and a tenant
  that could name a variable could have it sent to a server of its choosing;
- a reader who does not own a row (a tenant reading a shared row) sees a value
  that holds a reference as written (`Bearer ${LOOMCYCLE_X}`: a name, not a
  secret) and every other value masked; a tenant forking a shared row starts
  from that masked copy, so a fork never copies a literal secret either.
"""

from __future__ import annotations

from typing import Any

from apps.core.secrets import REF_RE, referenced_names
from apps.substrate.kinds import Kind, Refused

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


def _mask(value: Any) -> str:
    return value if isinstance(value, str) and REF_RE.search(value) else MASKED


def redacted(kind: Kind, definition: dict[str, Any]) -> dict[str, Any]:
    """`definition` with the literal values of its secret fields masked."""
    out = dict(definition)
    for field in kind.secret_fields:
        if isinstance(out.get(field), dict):
            out[field] = {k: _mask(v) for k, v in out[field].items()}
    return out
