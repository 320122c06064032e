"""Which stream a caller reaches, and the naming and scope rules the
transports (REST, WebSocket) and the Channel tool share.

- Admin routes (`/v1/_channels/{name}/...`) and the WebSocket without
  `user_id` reach a global/tenant channel's one stream in the caller's
  tenant, for any principal but an isolated end user (403 on both); an
  `agent`- or `user`-scoped channel has one stream per agent / user, so they
  answer 400 `channel_scope_invalid` for it.
- User routes (`/v1/users/{user_id}/channels/{name}/...`) reach the user's
  stream of a `scope: user` channel; an isolated principal (substrate:user)
  may only name its own user id, any other is a 404 `unknown_channel`.
- Fan-in / fan-out (`_await`, `_broadcast`) take the channel's declared scope
  and, for agent/user channels, a `scope_id`.
- `_system/` channels are published only by the operator's system publish,
  and only when declared in yaml for a global/tenant stream.
Nothing here writes.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from apps.channels.errors import (
    ChannelNotDeclared,
    ChannelScopeInvalid,
    NonSystemChannel,
    SystemScopeUnsupported,
    UnknownChannel,
)
from apps.channels.selectors import channel_get
from apps.channels.streams import Stream
from apps.core.errors import Forbidden, Invalid
from apps.core.ids import is_ident
from apps.core.types import Principal
from apps.substrate.kinds import Refused
from apps.substrate.kinds.fields import check_channel_name, is_system_channel
from apps.substrate.models import ChannelDef, ChannelScope, DefSource

ADMIN = "_admin"  # published_by / published_by_user_id of operator publishes (SPEC 9.4)
RESERVED_NAMES = frozenset({"_await", "_broadcast"})  # route names under /v1/_channels/
MAX_SCOPE_ID = 256
MAX_FANOUT = 32  # channels per await / broadcast
Target = tuple[Stream, ChannelDef]


def capped_wait_ms(raw: int | None) -> int:
    """The requested wait, cut to the operator's cap (0: do not wait)."""
    return min(raw or 0, max(settings.LOOMCYCLE.channels_longpoll_cap_ms, 0))


def fanout_names(names: Any, prefix: str) -> list[str]:
    """The channels of an await / broadcast: a non-empty list of names, deduplicated, at most MAX_FANOUT."""
    if not isinstance(names, list) or not names:
        raise Invalid(f"{prefix}missing required field: channels (non-empty list)", code="missing_channels")
    out: list[str] = []
    for name in names:
        if not isinstance(name, str) or not name:
            raise Invalid(f"{prefix}channels must be non-empty strings", code="invalid_channels")
        if name not in out:
            out.append(name)
    if len(out) > MAX_FANOUT:
        raise Invalid(f"{prefix}too many channels ({len(out)} > max {MAX_FANOUT})", code="too_many_channels")
    return out


def runtime_channel_name(raw: str) -> str:
    """A name a runtime channel may take: valid, and neither `_system/` nor a route name."""
    try:
        name = check_channel_name(raw, "name")
    except Refused as exc:
        raise Invalid(exc.message, code="invalid_channel_name") from exc
    if is_system_channel(name) or name in RESERVED_NAMES:
        raise Invalid(
            f'channel name "{name}" is reserved (`_system/` channels are declared in yaml with `publisher: system`)',
            code="channel_name_reserved",
        )
    return name


def scope_id_for(name: str, declared: ChannelDef, scope_id: str) -> str:
    """The scope_id of one stream of `declared`: "" for global/tenant, else the given agent name / user id."""
    if declared.scope not in (ChannelScope.USER, ChannelScope.AGENT):
        return ""
    what = "user id" if declared.scope == ChannelScope.USER else "agent name"
    if not scope_id:
        raise ChannelScopeInvalid(
            f'channel "{name}" has scope={declared.scope}: give scope_id (the {what}) to reach one of its streams'
        )
    if len(scope_id) > MAX_SCOPE_ID or (declared.scope == ChannelScope.USER and not is_ident(scope_id)):
        raise Invalid(f"invalid scope_id {scope_id[:40]!r} for scope={declared.scope}", code="invalid_scope_id")
    return scope_id


def admin_stream(principal: Principal, name: str) -> Target:
    """The stream of a global/tenant channel in the caller's tenant. An isolated end user
    (substrate:user) reads only its own user streams: 403, on every transport (REST's scope
    table refuses the route already; the WebSocket reaches this with channel:read)."""
    if principal.isolated:
        raise Forbidden(
            "insufficient scope: an end-user token reads only its own user streams (give user_id)",
            code="insufficient_scope",
        )
    declared = channel_get(tenant_id=principal.tenant_id, name=name)
    if declared.scope == ChannelScope.USER:
        raise ChannelScopeInvalid(
            f'channel "{name}" has scope=user (one stream per user): use /v1/users/{{user_id}}/channels/{name}/...'
        )
    if declared.scope == ChannelScope.AGENT:
        raise ChannelScopeInvalid(
            f'channel "{name}" has scope=agent (one stream per agent): only `_await` and `_broadcast` with '
            "scope_id=<agent name> reach its streams over REST"
        )
    return Stream(principal.tenant_id, name, declared.scope, ""), declared


def user_stream(principal: Principal, user_id: str, name: str) -> Target:
    """The user's stream of a scope=user channel; another user's is unknown to an isolated principal."""
    if not is_ident(user_id):
        raise Invalid("invalid user_id: must match [A-Za-z0-9_-]{1,128}", code="invalid_user_id")
    own = principal.read_user
    if own is not None and own != user_id:  # an isolated member sees only its own streams: no oracle
        raise UnknownChannel(f'unknown channel "{name}"')
    declared = channel_get(tenant_id=principal.tenant_id, name=name)
    if declared.scope != ChannelScope.USER:
        raise ChannelScopeInvalid(
            f'channel "{name}" has scope={declared.scope}, not user: use /v1/_channels/{name}/... instead'
        )
    return Stream(principal.tenant_id, name, ChannelScope.USER, user_id), declared


def user_publisher(principal: Principal) -> str:
    """published_by_user_id of a publish to a user stream: the isolated member, else the operator."""
    return principal.read_user or ADMIN


def fanout_stream(principal: Principal, name: str, scope: str, scope_id: str) -> Target:
    """One stream of an await / broadcast: `scope`, when given, must be the declared one."""
    declared = channel_get(tenant_id=principal.tenant_id, name=name)
    if scope and scope != declared.scope:
        raise ChannelScopeInvalid(f'channel "{name}" is declared with scope={declared.scope}, not {scope}')
    return Stream(principal.tenant_id, name, declared.scope, scope_id_for(name, declared, scope_id)), declared


def fanout_streams(principal: Principal, names: list[str], scope: str, scope_id: str) -> list[Target]:
    """Every target resolved before anything is done: one undeclared channel fails them all."""
    return [fanout_stream(principal, n, scope, scope_id) for n in names]


def system_stream(principal: Principal, name: str) -> Target:
    """The stream a system publish reaches: a yaml-declared global/tenant `_system/` channel."""
    if not is_system_channel(name):
        raise NonSystemChannel(
            f'channel "{name}" is not a system channel: POST /v1/_channels/{{name}} publishes to `_system/` '
            "channels only (use POST /v1/_channels/{name}/publish)"
        )
    declared = channel_get(tenant_id=principal.tenant_id, name=name)
    if declared.source != DefSource.YAML:
        raise ChannelNotDeclared(f'system channel "{name}" is not declared in yaml `channels:`')
    if declared.scope in (ChannelScope.USER, ChannelScope.AGENT):
        raise SystemScopeUnsupported(f"system publish to a scope={declared.scope} channel is not supported")
    return Stream(principal.tenant_id, name, declared.scope, ""), declared
