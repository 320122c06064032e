"""Channel wire shapes: what REST answers, what the Channel tool returns, and
the run events a tool call records. Pure functions of what the services and
selectors return; nothing here reads or writes the database."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from apps.channels.selectors import Awaited, ChannelStats
from apps.channels.streams import Published, Read, Stream
from apps.core.errors import ApplicationError
from apps.core.timefmt import ts
from apps.substrate.models import ChannelDef

Outcomes = Sequence[tuple[Stream, Published | ApplicationError]]


def descriptor(row: ChannelDef, stats: ChannelStats) -> dict[str, Any]:
    """The channel as a tenant sees it (`stats` are of its own streams)."""
    return {
        "name": row.name,
        "description": row.description,
        "scope": row.scope,
        "semantic": row.semantic,
        "publisher": row.publisher,
        "period": row.period,
        "default_ttl": row.default_ttl_seconds or 0,
        "max_messages": row.max_messages or 0,
        "source": row.source,
        "message_count": stats.message_count,
        "newest_visible_at": ts(stats.newest_visible_at),
        "created_at": ts(row.created_at),
        "updated_at": ts(row.updated_at),
    }


def published_rest(done: Published) -> dict[str, Any]:
    out: dict[str, Any] = {
        "msg_id": done.message_id,
        "channel": done.stream.channel,
        "created_at": ts(done.published_at),
        "dropped_oldest": done.dropped_oldest,
    }
    if done.deferred:
        out["visible_at"] = ts(done.visible_at)
    return out


def published_tool(done: Published) -> dict[str, Any]:
    out: dict[str, Any] = {
        "channel": done.stream.channel,
        "message_id": done.message_id,
        "dropped_oldest": done.dropped_oldest,
    }
    if done.deferred:
        out["visible_at"] = ts(done.visible_at)
    return out


def broadcast_rest(outcomes: Outcomes) -> dict[str, Any]:
    """A failure is reported per channel with its code, as loomcycle does."""
    results = [
        {"channel": stream.channel, "error": o.message, "code": o.code}
        if isinstance(o, ApplicationError)
        else published_rest(o)
        for stream, o in outcomes
    ]
    return _broadcast_totals(results)


def broadcast_tool(outcomes: Outcomes) -> dict[str, Any]:
    results = [
        {"channel": stream.channel, "error": o.message} if isinstance(o, ApplicationError) else published_tool(o)
        for stream, o in outcomes
    ]
    return _broadcast_totals(results)


def _broadcast_totals(results: list[dict[str, Any]]) -> dict[str, Any]:
    failed = sum(1 for r in results if "error" in r)
    return {"published": len(results) - failed, "failed": failed, "results": results}


def read_result(read: Read) -> dict[str, Any]:
    """A subscribe's answer (REST, tool and parked answers alike)."""
    return {"channel": read.stream.channel, "messages": read.messages, "next_cursor": read.next_cursor}


def peek_result(read: Read) -> dict[str, Any]:
    return {"channel": read.stream.channel, "messages": read.messages}


def await_result(awaited: Awaited) -> dict[str, Any]:
    return {
        "satisfied": awaited.satisfied,
        "timed_out": awaited.timed_out,
        "mode": awaited.spec.mode,
        "fired": awaited.fired,
        "total_messages": awaited.total_messages,
        "results": {r.stream.channel: {"messages": r.messages, "next_cursor": r.next_cursor} for r in awaited.reads},
    }


def stream_frame(stream: Stream, message: dict[str, Any], cursor: str) -> str:
    """One WebSocket frame: the message and its own cursor (resume after it)."""
    frame = {"channel": stream.channel, **message, "cursor": cursor}
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)


# --- what the Channel tool and parked answers report --------------------------------


def result_text(out: dict[str, Any]) -> str:
    """Tool results as loomcycle writes them: compact JSON, keys sorted."""
    return json.dumps(out, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _preview(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)[:200]


def publish_event(done: Published, value: Any) -> dict[str, Any]:
    return {
        "type": "channel_publish",
        "channel": {
            "channel": done.stream.channel,
            "message_id": done.message_id,
            "scope": done.stream.scope,
            "scope_id": done.stream.scope_id,
            "payload_bytes": done.payload_bytes,
            "payload_preview": _preview(value),
            "dropped_oldest": done.dropped_oldest,
        },
    }


def delivery_events(read: Read) -> list[dict[str, Any]]:
    """One `channel_delivery` event per message a subscribe delivered (SPEC 3.3)."""
    return [
        {
            "type": "channel_delivery",
            "channel": {
                "channel": read.stream.channel,
                "message_id": m["id"],
                "scope": read.stream.scope,
                "scope_id": read.stream.scope_id,
                "payload_preview": _preview(m["value"]),
                "cursor": cursor,
            },
        }
        for m, cursor in zip(read.messages, read.cursors, strict=True)
    ]
