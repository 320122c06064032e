"""`allow_hosts` in a pre hook's reply: extra hosts for this one call's network tools.

Honoured only for hooks whose `[tenant:]owner` the operator lists in
LOOMCYCLE_HOOKS_PERMIT_HOST_WIDEN (a bare `owner` means the deployment's
global hooks, tenant ""). Entries are hostnames (`a.com`, `.a.com`; never
`*`), added to the call's `ToolContext.allowed_hosts`, whose matching is the
egress guard's dot-boundary suffix match: `a.com` also admits `api.a.com`.
Widening lasts for the one call, never bypasses the guard's address checks,
and never turns on a network tool the operator has not configured. Each
widening is a `host_widened` run event (SPEC 3.3).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from django.conf import settings

from apps.core.tools import ToolContext
from apps.triggers.hooks.callback import HookCallFailed
from apps.triggers.hooks.types import Hook

HOST_RE = re.compile(r"\.?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")
MAX_HOSTS = 64


def parse(value: Any) -> tuple[str, ...]:
    """The reply's host list, lower-cased and checked; a bad entry fails the reply."""
    if not isinstance(value, list) or len(value) > MAX_HOSTS:
        raise HookCallFailed(f"pre reply: allow_hosts must be a list of at most {MAX_HOSTS} hostnames")
    hosts = []
    for item in value:
        host = item.strip().rstrip(".").lower() if isinstance(item, str) else ""
        if not HOST_RE.fullmatch(host) or len(host) > 253:
            raise HookCallFailed(f"pre reply: allow_hosts entry {item!r} is not a hostname (a.com or .a.com)")
        hosts.append(host)
    return tuple(hosts)


def permitted(hook: Hook) -> bool:
    """Whether the operator lets this hook's `[tenant:]owner` widen hosts."""
    key = f"{hook.tenant_id}:{hook.owner}" if hook.tenant_id else hook.owner
    return key in settings.LOOMCYCLE.hooks_permit_host_widen


def apply(
    ctx: ToolContext,
    tool: str,
    widenings: list[tuple[Hook, tuple[str, ...]]],
    data: dict[str, Any],
    events: list[dict[str, Any]],
) -> ToolContext:
    """The context the tool runs with: the run's hosts plus every permitted
    widening, each recorded in `events` as `host_widened`."""
    if not widenings:
        return ctx
    url = data.get("url") if isinstance(data.get("url"), str) else ""
    hosts = list(ctx.allowed_hosts)
    for hook, added in widenings:
        hosts.extend(added)
        widening = {
            "tool_call_id": ctx.call_id,
            "tool_name": tool,
            "url": url,
            "hook_owner": hook.owner,
            "hook_name": hook.name,
            "hosts_added": list(added),
        }
        events.append({"type": "host_widened", "host_widening": widening})
    return replace(ctx, allowed_hosts=tuple(dict.fromkeys(hosts)))
