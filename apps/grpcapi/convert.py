"""Between the loomcycle.v1 messages and what the services take and give: pure functions, no
rules. A request becomes the JSON body its HTTP route would parse (so the route's own schema
validates it, with the same refusals); a run row becomes `Agent` from the HTTP presenter's
fields; a stream frame becomes `Event` the way loomcycle maps its events (SPEC 3.3)."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.runs.models import Run
from apps.runs.presenters import agent_out
from apps.runs.streams import Frame

# RunRequest fields whose JSON form differs from the HTTP body's: handled one by one below.
_SPECIAL = frozenset({"segments", "allowed_hosts", "metadata", "hooks_json"})


def timestamp(value: dt.datetime | None) -> Timestamp | None:
    if value is None:
        return None
    out = Timestamp()
    out.FromDatetime(value)
    return out


def segments_json(segments: Any) -> list[dict[str, Any]]:
    """PromptSegment{role, content[block]} as one flat JSON segment per block (role plus the
    block's fields), the shape every admission route's parser takes; image bytes as base64."""
    out: list[dict[str, Any]] = []
    for segment in segments:
        for block in segment.content:
            item: dict[str, Any] = {"role": segment.role or "user", "type": block.type or "trusted-text"}
            item["text"] = block.text
            if block.cacheable:
                item["cacheable"] = True
            if block.kind:
                item["kind"] = block.kind
            if block.media_type:
                item["media_type"] = block.media_type
            if block.data:
                item["data"] = base64.b64encode(block.data).decode()
            out.append(item)
    return out


def _json_bytes(raw: bytes) -> Any:
    """A bytes field that carries JSON (metadata, hooks_json). Not JSON is the caller's error,
    refused by the route's schema: it is passed on as text."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def request_body(request: Message) -> dict[str, Any]:
    """Every field the caller set, by its proto name (the HTTP body's names: loomcycle's JSON and
    proto share them), so the route's schema decides what is accepted, acted on or refused;
    int64 as JSON numbers' strings (the schemas' ints take them), bytes as base64."""
    out: dict[str, Any] = json_format.MessageToDict(request, preserving_proto_field_name=True)
    return out


def run_body(request: Any) -> dict[str, Any]:
    """RunRequest / ContinueRequest -> the JSON body of POST /v1/runs (.../messages)."""
    body = {k: v for k, v in request_body(request).items() if k not in _SPECIAL}
    body["segments"] = segments_json(request.segments)
    if request.HasField("allowed_hosts"):  # present but empty: no network, as [] over HTTP
        body["allowed_hosts"] = list(request.allowed_hosts.list)
    if request.metadata:
        body["metadata"] = _json_bytes(request.metadata)
    if request.hooks_json:
        body["hooks"] = _json_bytes(request.hooks_json)
    return body


def continue_body(request: Any) -> dict[str, Any]:
    """ContinueRequest -> the body of POST /v1/sessions/{session_id}/messages (the id is the path's)."""
    body = run_body(request)
    body.pop("session_id", None)
    return body


def _agent_usage(usage: dict[str, Any]) -> pb.AgentUsage:
    return pb.AgentUsage(
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        cache_creation_tokens=int(usage.get("cache_creation_input_tokens") or 0),
        cache_read_tokens=int(usage.get("cache_read_input_tokens") or 0),
        model=str(usage.get("model") or ""),
        provider=str(usage.get("provider") or ""),
    )


def agent(run: Run) -> pb.Agent:
    """The HTTP presenter's agent object (GET /v1/runs/{id}) as `Agent`."""
    out = agent_out(run)
    return pb.Agent(
        agent_id=out["agent_id"],
        run_id=out["run_id"],
        session_id=out["session_id"],
        user_id=out["user_id"] or "",
        parent_agent_id=out["parent_agent_id"] or "",
        parent_run_id=run.parent_id or "",
        status=out["status"],
        started_at=timestamp(run.started_at or run.created_at),
        completed_at=timestamp(run.completed_at),
        last_heartbeat_at=timestamp(run.last_heartbeat_at),
        stop_reason=out["stop_reason"] or "",
        error=out["error"] or "",
        usage=_agent_usage(out["usage"] or {}),
        live=out["live"],
        agent=out["agent"] or "",
        interactive=out["interactive"],
        awaited_state=out["awaited_state"],
        awaited_on=out["awaited_on"],
        retention=out["retention"],
    )


def usage(usage: dict[str, Any]) -> pb.Usage:
    au = _agent_usage(usage)
    return pb.Usage(
        input_tokens=au.input_tokens,
        output_tokens=au.output_tokens,
        cache_creation_tokens=au.cache_creation_tokens,
        cache_read_tokens=au.cache_read_tokens,
        model=au.model,
    )


def _tool_use(raw: dict[str, Any]) -> pb.ToolUse:
    value = raw.get("input")
    data = value if isinstance(value, str) else json.dumps(value if value is not None else {})
    return pb.ToolUse(id=str(raw.get("id") or ""), name=str(raw.get("name") or ""), input=data.encode())


# Event payload objects that map onto a sub-message of the same shape (field names as stored).
_SUBMESSAGES = {
    "retry": pb.Retry,
    "limit": pb.LimitInfo,
    "host_widening": pb.HostWidening,
    "awaiting_input": pb.AwaitingInput,
    "user_input": pb.UserInput,
    "capability_inert": pb.CapabilityInertInfo,
}


def _sub(cls: Any, raw: dict[str, Any]) -> Any:
    """The payload's fields the message has; a value of another type than the field's is left
    out (the event is still sent: its `type` and text carry it)."""
    out = cls()
    for name in (f.name for f in cls.DESCRIPTOR.fields):
        if name in raw and raw[name] is not None:
            try:
                json_format.ParseDict({name: raw[name]}, out, ignore_unknown_fields=True)
            except json_format.ParseError:
                continue
    return out


def event(frame: Frame) -> pb.Event:
    """A stream frame (apps.runs.streams) as loomcycle's `Event`: `type`, the scalar fields,
    tool_use (input as JSON bytes), usage, and the typed payloads the message carries."""
    data = frame.data
    out = pb.Event(
        type=str(data.get("type") or frame.event),
        text=str(data.get("text") or ""),
        error=str(data.get("error") or ""),
        is_error=bool(data.get("is_error")),
        stop_reason=str(data.get("stop_reason") or ""),
    )
    if isinstance(data.get("tool_use"), dict):
        out.tool_use.CopyFrom(_tool_use(data["tool_use"]))
    if isinstance(data.get("usage"), dict) and data["usage"]:
        out.usage.CopyFrom(usage(data["usage"]))
    for name, cls in _SUBMESSAGES.items():
        if isinstance(data.get(name), dict):
            getattr(out, name).CopyFrom(_sub(cls, data[name]))
    return out


def agent_frame(run: Run, parent_agent_id: str = "") -> pb.Event:
    """The registration frame after `session` (SPEC 3.2): loomcycle's gRPC packs the run's ids
    as text=agent_id, stop_reason=parent_agent_id, error=JSON envelope (the client reads it)."""
    envelope = {"agent_id": run.agent_id, "run_id": run.id, "session_id": run.session_id}
    envelope["parent_agent_id"] = parent_agent_id
    return pb.Event(type="agent", text=run.agent_id, stop_reason=parent_agent_id, error=json.dumps(envelope))
