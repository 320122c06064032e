"""The admin-plane kinds (MCPServerDef, ScheduleDef, WebhookDef): never
agent-callable (SPEC 6.5), authored over REST, admin or yaml only.

Each normaliser follows kinds.py: `strict` is True for runtime writes (unknown
fields refused) and False for yaml (unknown fields dropped with a warning).
Only validation lives here: the scheduler that fires a ScheduleDef, the
receiver behind a WebhookDef and the MCP client (apps.mcp, which adds the
MCPServerDef ops `rediscover` and discovery on create/fork) are other parts of the build.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apps.substrate import hashing
from apps.substrate.kinds import Kind, register
from apps.substrate.kinds_admin.mcp import normalise_mcpserver
from apps.substrate.kinds_admin.schedule import normalise_schedule, schedule_add_hook, schedule_remove_hook
from apps.substrate.kinds_admin.webhook import normalise_webhook
from apps.substrate.models import (
    MCPServerDef,
    MCPServerDefActive,
    ScheduleDef,
    ScheduleDefActive,
    WebhookDef,
    WebhookDefActive,
)

_TRIGGER_OPS = frozenset({"create", "fork", "get", "list", "retire"})

register(
    Kind(
        key="mcpserver",
        tool="MCPServerDef",
        model=MCPServerDef,
        pointer=MCPServerDefActive,
        ops=frozenset({"create", "fork", "get", "list", "retire", "promote", "verify"}),
        normalise=normalise_mcpserver,
        content_hash=hashing.mcp_content_sha256,
        yaml_key="mcp_servers",
        secret_fields=("headers", "env"),
    )
)
register(
    Kind(
        key="schedule",
        tool="ScheduleDef",
        model=ScheduleDef,
        pointer=ScheduleDefActive,
        ops=_TRIGGER_OPS,
        normalise=normalise_schedule,
        content_hash=None,
        fork_promotes=True,
        yaml_key="scheduled_runs",
        credential_env_fields=("user_credentials_from_env",),
    )
)
register(
    Kind(
        key="webhook",
        tool="WebhookDef",
        model=WebhookDef,
        pointer=WebhookDefActive,
        ops=_TRIGGER_OPS,
        normalise=normalise_webhook,
        content_hash=None,
        fork_promotes=True,
        yaml_key="webhooks",
        credential_env_fields=("user_credentials_from_env", "auth.signing_secret_env", "auth.bearer_token_env"),
    )
)

EXTRA_OPS: dict[str, dict[str, Callable[..., dict[str, Any]]]] = {
    "schedule": {"add_hook": schedule_add_hook, "remove_hook": schedule_remove_hook},
}


def install_ops() -> None:
    """Make the kind-specific ops known to `services.def_dispatch`. Called
    from an AppConfig.ready(): services imports kinds (and so this module)
    before it defines its EXTRA_OPS, so this cannot run at import time."""
    from apps.substrate import services

    for key, ops in EXTRA_OPS.items():
        services.EXTRA_OPS.setdefault(key, {}).update(ops)
