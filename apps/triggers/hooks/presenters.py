"""The wire shape of a registration."""

from __future__ import annotations

from typing import Any

from apps.core.timefmt import iso_z
from apps.triggers.models import HookRegistration


def hook_out(row: HookRegistration) -> dict[str, Any]:
    return {
        "id": row.hook_id,
        "tenant_id": row.tenant_id,
        "owner": row.owner,
        "name": row.name,
        "phase": row.phase,
        "agents": row.agents,
        "tools": row.tools,
        "callback_url": row.callback_url,
        "fail_mode": row.fail_mode,
        "timeout_ms": row.timeout_ms,
        "created_at": iso_z(row.created_at),
        "updated_at": iso_z(row.updated_at),
    }
