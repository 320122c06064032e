"""The interruption bridge (SPEC 9.4): an ask that parks a run is published to
`_system/interrupts/pending`, and an interrupt that leaves `pending` to
`_system/interrupts/resolved`, when the operator declared that channel in yaml
(`publisher: system`). Undeclared: nothing is published.

Receivers of apps.runs.signals (at least once, after the commit): the publish
carries an idempotency key per interrupt and transition, so a re-sent signal
publishes nothing twice. A user-scoped channel gets one stream per user (a run
without a user publishes nothing there); an agent-scoped one per agent name.
"""

from __future__ import annotations

import logging
from typing import Any

from apps.channels import services
from apps.channels.errors import ChannelNotDeclared
from apps.channels.selectors import channel_get
from apps.channels.streams import Stream
from apps.runs import signals
from apps.substrate.models import ChannelScope, DefSource

log = logging.getLogger("loomcycle.channels")

PENDING = "_system/interrupts/pending"
RESOLVED = "_system/interrupts/resolved"


def _publish(name: str, *, tenant_id: str, user_id: str, agent: str, value: dict[str, Any], key: str) -> None:
    try:
        declared = channel_get(tenant_id=tenant_id, name=name)
    except ChannelNotDeclared:
        return
    if declared.source != DefSource.YAML:  # `_system/` channels are the operator's, declared in yaml
        return
    scope_id = {ChannelScope.USER: user_id, ChannelScope.AGENT: agent}.get(ChannelScope(declared.scope), "")
    if declared.scope in (ChannelScope.USER, ChannelScope.AGENT) and not scope_id:
        log.info("%s is %s-scoped and the run has none: not published", name, declared.scope)
        return
    stream = Stream(tenant_id, name, declared.scope, scope_id)
    services.publish(
        stream=stream,
        declared=declared,
        value=value,
        published_by="_system",
        published_by_user_id="_system",
        idempotency_key=key,
    )


def on_pending(sender: Any, **kw: Any) -> None:
    value = {"run_id": kw["run_id"], "agent_id": kw["agent_id"], "user_id": kw["user_id"], **kw["interruption"]}
    interrupt_id = kw["interruption"]["interrupt_id"]
    _publish(
        PENDING,
        tenant_id=kw["tenant_id"],
        user_id=kw["user_id"],
        agent=kw["agent"],
        value=value,
        key=f"{interrupt_id}:pending",
    )


def on_resolved(sender: Any, **kw: Any) -> None:
    fields = ("run_id", "user_id", "interrupt_id", "status", "resolved_by", "resolved_at")
    value = {f: kw[f] for f in fields}
    _publish(
        RESOLVED,
        tenant_id=kw["tenant_id"],
        user_id=kw["user_id"],
        agent=kw.get("agent", ""),
        value=value,
        key=f"{kw['interrupt_id']}:resolved",
    )


def connect() -> None:
    """From AgentChannelsConfig.ready(); idempotent (dispatch_uid)."""
    signals.interruption_pending.connect(on_pending, dispatch_uid="channels.bridge.pending")
    signals.interruption_resolved.connect(on_resolved, dispatch_uid="channels.bridge.resolved")
