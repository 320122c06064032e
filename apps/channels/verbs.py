"""The channel verbs REST (apps/channels/api.py), gRPC (apps/grpcapi/channels.py) and the MCP
server (apps/mcp/server/tools_data.py: publish) answer: list, publish, fan-out broadcast and
fan-in await. Each transport parses its own wire (a JSON body, a protobuf message, tool
arguments) into these arguments and presents the dict answered; the
checks and their order live here once. Subscribe-that-waits is `longpoll.subscribe_waiting`.

A payload is any JSON value but null: a transport passes None when the request carries none,
and the verb refuses it (400 missing_payload) at the point the REST contract names.
"""

from __future__ import annotations

from typing import Any

from apps.channels import access, presenters, selectors, services
from apps.channels.longpoll import long_poll
from apps.channels.schemas import ChannelCreateIn
from apps.channels.streams import Stream, bell, check_cursor
from apps.core.errors import Invalid
from apps.core.http import db_call
from apps.core.types import Principal
from apps.substrate import channeldefs
from apps.substrate.models import ChannelDef


def _value(value: Any, op: str) -> Any:
    if value is None:
        raise Invalid(f"{op}: missing required field: payload (any JSON value but null)", code="missing_payload")
    return value


def channel_list(principal: Principal) -> list[dict[str, Any]]:
    """The tenant's visible channels (yaml and runtime), each described with its stats."""
    tenant = principal.tenant_id
    return [
        presenters.descriptor(row, selectors.channel_stats(tenant_id=tenant, name=row.name))
        for row in selectors.channels_visible(tenant_id=tenant)
    ]


def described(row: ChannelDef, tenant_id: str) -> dict[str, Any]:
    """A declaration as REST and MCP show it: the row and its stream's stats."""
    return presenters.descriptor(row, selectors.channel_stats(tenant_id=tenant_id, name=row.name))


def channel_create(principal: Principal, body: ChannelCreateIn) -> dict[str, Any]:
    """Declare a runtime channel in the caller's tenant (409 channel_yaml_immutable / channel_name_in_use)."""
    name = access.runtime_channel_name(body.name)
    spec = channeldefs.ChannelSpec(
        description=body.description,
        scope=body.scope,
        semantic=body.semantic,
        default_ttl=body.default_ttl,
        max_messages=body.max_messages,
        publisher=body.publisher,
        period=body.period,
    )
    row = channeldefs.channeldef_create(tenant_id=principal.tenant_id, name=name, spec=spec)
    return described(row, principal.tenant_id)


def channel_update(principal: Principal, name: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Change a runtime channel's declaration (409 for a yaml one)."""
    row = channeldefs.channeldef_update(tenant_id=principal.tenant_id, name=name, changes=changes)
    return described(row, principal.tenant_id)


def publish(target: access.Target, *, value: Any, ttl: int | None, deliver_at: Any, by_user: str) -> dict[str, Any]:
    """Publish `value` on the resolved stream; `by_user` is the publisher recorded."""
    stream, declared = target
    done = services.publish(
        stream=stream,
        declared=declared,
        value=_value(value, "publish"),
        ttl=ttl,
        deliver_at=services.parse_deliver_at(deliver_at),
        published_by=access.ADMIN,
        published_by_user_id=by_user,
    )
    return presenters.published_rest(done)


def broadcast(
    principal: Principal,
    *,
    channels: Any,
    scope: str,
    scope_id: str,
    value: Any,
    ttl: int | None,
    deliver_at: Any,
) -> dict[str, Any]:
    """One payload to several channels. Every target is resolved first (one undeclared channel
    and nothing is published), then the size (413), then ttl and deliver_at."""
    names = access.fanout_names(channels, "broadcast: ")
    checked = _value(value, "broadcast")
    targets = access.fanout_streams(principal, names, scope, scope_id)
    services.check_payload(checked)
    outcomes = services.broadcast(
        targets=targets,
        value=checked,
        ttl=ttl,
        deliver_at=services.parse_deliver_at(deliver_at),
        published_by=access.ADMIN,
        published_by_user_id=access.ADMIN,
    )
    return presenters.broadcast_rest(outcomes)


def _await_streams(
    principal: Principal, channels: Any, scope: str, scope_id: str, from_cursor: Any
) -> list[tuple[Stream, str | None]]:
    names = access.fanout_names(channels, "await: ")
    cursor = check_cursor(from_cursor)
    return [(stream, cursor) for stream, _ in access.fanout_streams(principal, names, scope, scope_id)]


async def await_waiting(
    principal: Principal,
    *,
    channels: Any,
    scope: str,
    scope_id: str,
    from_cursor: Any,
    mode: Any,
    n: Any,
    max_messages: int | None,
    wait_ms: int | None,
) -> dict[str, Any]:
    """Wait for messages on several channels (mode any|all|at_least, never commits a cursor), up
    to `wait_ms` (cut to the operator's cap); a timeout answers what is there."""
    checked = selectors.check_await(mode, n, "await: ")
    spec = selectors.AwaitSpec(checked.mode, checked.n, selectors.clamp_max(max_messages))
    streams = await db_call(_await_streams)(principal, channels, scope, scope_id, from_cursor)
    read = db_call(selectors.await_read)

    async def attempt(final: bool) -> tuple[bool, dict[str, Any]]:
        got = await read(streams=streams, spec=spec, timed_out=final)
        return got.satisfied, presenters.await_result(got)

    bells = [bell(s.tenant_id, s.channel) for s, _ in streams]
    return await long_poll(bells, access.capped_wait_ms(wait_ms), attempt)
