"""`Channel`: persistent inter-agent channels (SPEC 6.3), a thin adapter over
the channel services.

- A channel must be declared (yaml `channels:` or `POST /v1/_channels`), and
  the agent definition's `channels.publish` / `channels.subscribe` allowlists
  must name it: an exact name, or `prefix/*` for the names under `prefix/`
  (not `prefix` itself). Default-deny. `_system/*` and `publisher: system`
  channels refuse agent publishes.
- The stream follows the channel's declared scope: agent -> this agent's
  name, user -> this run's user_id, global/tenant -> one stream per tenant.
- A `subscribe` or `await` with `wait_ms` that finds nothing PARKS the run
  (`waiting_channel`, no worker held): a publish or the deadline answers it
  (apps.channels.waits). `wait_ms` is cut to LOOMCYCLE_CHANNELS_LONGPOLL_CAP_MS.
- Results are compact JSON with sorted keys; refusals are `is_error` texts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apps.channels import access, cursors, presenters, selectors, services
from apps.channels.errors import ChannelCursorRegression, ChannelNotDeclared
from apps.channels.streams import Read, Stream, check_cursor
from apps.channels.waits import WaitRequest, park
from apps.core.errors import ApplicationError
from apps.core.tools import Tool, ToolContext, ToolRefusal, ToolResult, op_tool_result
from apps.substrate.kinds.fields import is_system_channel
from apps.substrate.models import ChannelDef
from apps.substrate.selectors import agent_definition

OPS = ("publish", "subscribe", "ack", "peek", "list_channels", "await", "broadcast")
FIELDS = frozenset(
    {"op", "channel", "channels", "mode", "n", "value", "ttl", "deliver_at", "from_cursor", "max_messages", "wait_ms"}
    | {"cursor"}
)
PUBLISH, SUBSCRIBE = "publish", "subscribe"


class Refusal(ToolRefusal):
    """A bad call: the message goes back to the model as an is_error result."""


def channel_allowed(patterns: list[str], name: str) -> bool:
    """Exact name, or `p/*` matching names under `p/` (never `p` itself; a bare `*` is literal)."""
    name = name.strip()
    if ".." in name or "//" in name:
        return False
    for pattern in patterns:
        if pattern == name:
            return True
        if pattern.endswith("/*") and name.startswith(pattern[:-1]) and len(name) > len(pattern) - 1:
            return True
    return False


class _Caller:
    """The calling run's view of channels: its tenant, identity and allowlists."""

    def __init__(self, ctx: ToolContext) -> None:
        self.ctx = ctx
        acl = agent_definition(ctx.agent_def_id).get("channels") or {}
        if not isinstance(acl, dict) or not all(isinstance(acl.get(s) or [], list) for s in (PUBLISH, SUBSCRIBE)):
            raise Refusal(
                "Channel tool: this agent's `channels` field must be a mapping "
                "{publish: [names], subscribe: [names]}; fix the agent definition"
            )
        self.acl = {side: [p for p in acl.get(side) or [] if isinstance(p, str)] for side in (PUBLISH, SUBSCRIBE)}

    def resolve(self, name: Any, side: str) -> tuple[Stream, ChannelDef]:
        if not isinstance(name, str) or not name:
            raise Refusal("missing required field: channel")
        try:
            declared = selectors.channel_get(tenant_id=self.ctx.tenant_id, name=name)
        except ChannelNotDeclared as exc:
            raise Refusal(
                f'Channel tool: channel "{name}" is not declared (yaml `channels:` block or POST /v1/_channels)'
            ) from exc
        allow = self.acl[side]
        if not allow:
            raise Refusal(
                f"Channel tool: this agent has no {side} allowlist — add `channels.{side}: [{name}]` to the agent yaml"
            )
        if not channel_allowed(allow, name):
            listed = " ".join(allow)
            raise Refusal(f'Channel tool: {side} not allowed on channel "{name}" (agent allowlist: [{listed}])')
        return Stream(self.ctx.tenant_id, name, declared.scope, self._scope_id(name, declared.scope)), declared

    def _scope_id(self, name: str, scope: str) -> str:
        if scope == "agent":
            if not self.ctx.agent_name:
                raise Refusal(f'Channel tool: channel "{name}" has scope=agent but the run has no agent name')
            return self.ctx.agent_name
        if scope == "user":
            if not self.ctx.user_id:
                raise Refusal(f'Channel tool: channel "{name}" has scope=user but the run has no user_id')
            return self.ctx.user_id
        return ""


def _check_publishable(name: str, declared: ChannelDef, prefix: str = "") -> None:
    if is_system_channel(name):
        raise Refusal(
            f'{prefix}channel "{name}" starts with `_system/` (reserved prefix) — '
            "agents may not publish to system channels"
        )
    if declared.publisher == "system":
        raise Refusal(f'{prefix}channel "{name}" is `publisher: system` — agents may not publish')


def _int(data: dict[str, Any], name: str, low: int = 0) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise Refusal(f"{name} must be an integer >= {low}")
    return value


def _wait_ms(data: dict[str, Any]) -> int:
    """The requested wait, cut to the operator's cap (0: do not wait)."""
    return access.capped_wait_ms(_int(data, "wait_ms"))


def _from_cursor(data: dict[str, Any]) -> str | None:
    return check_cursor(data.get("from_cursor"))


def _publish(caller: _Caller, data: dict[str, Any]) -> ToolResult:
    stream, declared = caller.resolve(data.get("channel"), PUBLISH)
    _check_publishable(stream.channel, declared)
    if "value" not in data:
        raise Refusal("publish: missing required field: value")
    done = services.publish(
        stream=stream,
        declared=declared,
        value=data["value"],
        ttl=_int(data, "ttl"),
        deliver_at=services.parse_deliver_at(data.get("deliver_at")),
        published_by=caller.ctx.run_id,
        published_by_user_id=caller.ctx.user_id,
        idempotency_key=caller.ctx.idempotency_key,
    )
    return _ok(presenters.published_tool(done), events=(presenters.publish_event(done, data["value"]),))


def _subscribe(caller: _Caller, data: dict[str, Any]) -> ToolResult:
    stream, _ = caller.resolve(data.get("channel"), SUBSCRIBE)
    from_cursor = _from_cursor(data)
    limit = selectors.clamp_max(data.get("max_messages"))
    read = cursors.subscribe(stream=stream, from_cursor=from_cursor, max_messages=limit)
    wait_ms = _wait_ms(data)
    if not read.messages and wait_ms > 0:
        return ToolResult("", park=park(WaitRequest("subscribe", [(stream, from_cursor)], limit), wait_ms))
    return _delivered(read)


def _delivered(read: Read) -> ToolResult:
    return _ok(presenters.read_result(read), events=tuple(presenters.delivery_events(read)))


def _peek(caller: _Caller, data: dict[str, Any]) -> ToolResult:
    stream, _ = caller.resolve(data.get("channel"), SUBSCRIBE)
    read = selectors.peek(
        stream=stream, from_cursor=_from_cursor(data), max_messages=selectors.clamp_max(data.get("max_messages"))
    )
    return _ok(presenters.peek_result(read))


def _ack(caller: _Caller, data: dict[str, Any]) -> ToolResult:
    stream, _ = caller.resolve(data.get("channel"), SUBSCRIBE)
    try:
        return _ok(cursors.ack(stream=stream, cursor=data.get("cursor")))
    except ChannelCursorRegression as exc:
        raise Refusal(f"ack: cursor_regression: {exc.message}") from exc  # loomcycle's ChannelError code


def _list_channels(caller: _Caller, data: dict[str, Any]) -> ToolResult:
    return _ok({PUBLISH: caller.acl[PUBLISH], SUBSCRIBE: caller.acl[SUBSCRIBE]})


def _await(caller: _Caller, data: dict[str, Any]) -> ToolResult:
    names = access.fanout_names(data.get("channels"), "await: ")
    spec = selectors.check_await(data.get("mode"), data.get("n"))
    spec = selectors.AwaitSpec(spec.mode, spec.n, selectors.clamp_max(data.get("max_messages")))
    from_cursor = _from_cursor(data)
    streams = [(caller.resolve(name, SUBSCRIBE)[0], from_cursor) for name in names]
    wait_ms = _wait_ms(data)
    awaited = selectors.await_read(streams=streams, spec=spec, timed_out=wait_ms == 0)
    if not awaited.satisfied and wait_ms > 0:
        request = WaitRequest("await", streams, spec.max_messages, spec.mode, spec.n)
        return ToolResult("", park=park(request, wait_ms))
    return _ok(presenters.await_result(awaited))


def _broadcast(caller: _Caller, data: dict[str, Any]) -> ToolResult:
    names = access.fanout_names(data.get("channels"), "broadcast: ")
    if "value" not in data:
        raise Refusal("broadcast: missing required field: value")
    targets = []
    for name in names:  # ACL pre-flight: one refusal and nothing is published
        stream, declared = caller.resolve(name, PUBLISH)
        _check_publishable(name, declared, "broadcast: ")
        targets.append((stream, declared))
    services.check_payload(data["value"])  # an oversized value is refused before ttl and deliver_at
    outcomes = services.broadcast(
        targets=targets,
        value=data["value"],
        ttl=_int(data, "ttl"),
        deliver_at=services.parse_deliver_at(data.get("deliver_at")),
        published_by=caller.ctx.run_id,
        published_by_user_id=caller.ctx.user_id,
        idempotency_key=caller.ctx.idempotency_key,
    )
    events = tuple(
        presenters.publish_event(o, data["value"]) for _, o in outcomes if not isinstance(o, ApplicationError)
    )
    return _ok(presenters.broadcast_tool(outcomes), events=events)


def _ok(out: dict[str, Any], events: tuple[dict[str, Any], ...] = ()) -> ToolResult:
    return ToolResult(presenters.result_text(out), events=events)


_HANDLERS: dict[str, Callable[[_Caller, dict[str, Any]], ToolResult]] = {
    "publish": _publish,
    "subscribe": _subscribe,
    "ack": _ack,
    "peek": _peek,
    "list_channels": _list_channels,
    "await": _await,
    "broadcast": _broadcast,
}


def channel_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    return op_tool_result(data, ops=OPS, fields=FIELDS, run=lambda op: _HANDLERS[op](_Caller(ctx), data))


CHANNEL_TOOL = Tool(
    name="Channel",
    description="Persistent channels between agents. op: publish (channel, value, optional ttl seconds, "
    "deliver_at RFC 3339), subscribe (channel; reads after this agent's cursor and commits it; wait_ms waits "
    "for a message without holding a worker), peek (non-committing, from_cursor), ack (cursor), list_channels, "
    "await (channels, mode any|all|at_least, n, wait_ms; never commits), broadcast (channels, value). Channels "
    "must be declared and allowed by the agent's channels.publish / channels.subscribe lists.",
    input_schema={
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": list(OPS)},
            "channel": {"type": "string"},
            "channels": {"type": "array", "items": {"type": "string"}, "maxItems": access.MAX_FANOUT},
            "mode": {"type": "string", "enum": list(selectors.MODES), "description": "await: default any."},
            "n": {"type": "integer", "description": "await with mode=at_least: messages needed in total."},
            "value": {"description": "publish/broadcast: any JSON value."},
            "ttl": {"type": "integer", "description": "Seconds the message lives (default: the channel's)."},
            "deliver_at": {"type": "string", "description": "RFC 3339 time the message becomes visible."},
            "from_cursor": {"type": "string", "description": "Read after this cursor; cur_0 replays from the oldest."},
            "max_messages": {"type": "integer", "description": "Default 10, cap 100."},
            "wait_ms": {"type": "integer", "description": "subscribe/await: how long to wait for messages."},
            "cursor": {"type": "string", "description": "ack: the cursor to commit."},
        },
        "required": ["op"],
        "additionalProperties": False,
    },
    execute=channel_execute,
)
