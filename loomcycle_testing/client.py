"""Helpers over the runtime's HTTP API: run an agent and collect its events,
define an agent through the substrate API, assert on tool calls.

Invariants:
- Only HTTP (httpx): nothing here imports the runtime.
- `run_agent` returns only once the run is terminal (a `done` or `error`
  frame) or raises RunTimeout after cancelling it; a dropped stream is
  re-attached with `Last-Event-ID`, so no event is lost or repeated.
- `Result` is frozen, and built from what the server sent: `events` and
  `tool_calls` from the stream, `status` and `transcript` from
  `GET /v1/runs/{id}/events` (there is no transcript endpoint: the
  conversation is rebuilt from the persisted events, as the engine built it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from loomcycle_testing.transcript import transcript_from_events

TERMINAL = frozenset({"done", "error"})
Event = tuple[str, dict[str, Any]]


class LoomcycleError(AssertionError):
    """The runtime refused a request; the message has its status, code and error."""


class RunTimeout(AssertionError):
    """A run did not end within the timeout (it was cancelled)."""


@dataclass(frozen=True)
class ToolCall:
    """One tool use and its result (`result` is None when no result was streamed)."""

    id: str
    name: str
    input: dict[str, Any]
    result: str | None
    is_error: bool


@dataclass(frozen=True)
class Result:
    """A finished run, as the helpers saw it."""

    run_id: str
    agent_id: str
    status: str  # the run's state: completed, failed or cancelled
    events: tuple[Event, ...]  # every SSE frame, in order: (event, data)
    text: str  # the last `text` event's text ("" if the model wrote none)
    tool_calls: tuple[ToolCall, ...]  # in the order the model made them
    transcript: tuple[dict[str, Any], ...]  # {"role", "content": [blocks]}, see transcript.py
    stop_reason: str  # the `done` frame's stop_reason, or "" after an `error`
    error: str  # the `error` frame's text, or ""


def _refused(resp: httpx.Response, what: str) -> LoomcycleError:
    resp.read()
    try:
        body = resp.json()
        detail = f"{body.get('code')}: {body.get('error')}" if isinstance(body, dict) else resp.text
    except ValueError:  # not JSON: show the text as it came
        detail = resp.text[:500]
    return LoomcycleError(f"{what}: HTTP {resp.status_code} {detail}")


def sse_frames(resp: httpx.Response) -> Iterator[tuple[str | None, str, dict[str, Any]]]:
    """(id or None, event, data) per SSE frame; comments (keepalives) skipped."""
    frame: dict[str, str] = {}
    for line in resp.iter_lines():
        if line == "":
            if "event" in frame:
                yield frame.get("id"), frame["event"], json.loads(frame.get("data", "{}"))
            frame = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(":")
            frame[key] = value.removeprefix(" ")


class _Collector:
    """Frames of one run, across re-attaches, until a terminal frame or the deadline."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.events: list[Event] = []
        self.run_id = ""
        self.agent_id = ""
        self.last_id = "0"

    @property
    def finished(self) -> bool:
        return bool(self.events) and self.events[-1][0] in TERMINAL

    def read(self, resp: httpx.Response) -> None:
        for seq, event, data in sse_frames(resp):
            if event == "agent":
                self.run_id = self.run_id or str(data.get("run_id", ""))
                self.agent_id = self.agent_id or str(data.get("agent_id", ""))
                if self.events and self.events[-1][0] == "agent":
                    continue  # a re-attached stream opens with `agent` again: keep the first
            self.last_id = seq or self.last_id
            self.events.append((event, data))
            if event in TERMINAL or time.monotonic() > self.deadline:
                return


def _stream_timeout(deadline: float) -> httpx.Timeout:
    return httpx.Timeout(10.0, read=max(0.1, deadline - time.monotonic()))


def _follow(client: httpx.Client, body: dict[str, Any], collector: _Collector) -> None:
    """POST the run, then re-attach after a dropped stream, until terminal or the deadline."""
    try:
        with client.stream("POST", "/v1/runs", json=body, timeout=_stream_timeout(collector.deadline)) as resp:
            if resp.status_code != 200:
                raise _refused(resp, f"POST /v1/runs {body.get('agent')!r}")
            collector.read(resp)
    except httpx.TransportError:
        if not collector.run_id:
            raise  # the run may not exist: nothing to re-attach to
    while not collector.finished and time.monotonic() < collector.deadline:
        path = f"/v1/runs/{collector.run_id}/stream"
        headers = {"Last-Event-ID": collector.last_id}
        try:
            with client.stream("GET", path, headers=headers, timeout=_stream_timeout(collector.deadline)) as resp:
                if resp.status_code != 200:
                    raise _refused(resp, f"GET {path}")
                collector.read(resp)
        except (httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError):
            continue  # dropped or silent until the deadline: the loop condition decides


def _persisted_events(client: httpx.Client, run_id: str) -> tuple[str, list[dict[str, Any]]]:
    """(state, every persisted event) through GET /v1/runs/{id}/events, page by page."""
    rows: list[dict[str, Any]] = []
    while True:
        after = rows[-1]["seq"] if rows else 0
        resp = client.get(f"/v1/runs/{run_id}/events", params={"from_seq": after, "limit": 5000})
        if resp.status_code != 200:
            raise _refused(resp, f"GET /v1/runs/{run_id}/events")
        page = resp.json()
        rows.extend(page["events"])
        if not page["events"] or rows[-1]["seq"] >= page["last_seq"]:
            return str(page["state"]), rows


def tool_calls_from(events: list[Event]) -> tuple[ToolCall, ...]:
    """Pair each `tool_call` frame with its `tool_result` (by tool_use id)."""
    results = {str(data.get("tool_use", {}).get("id")): data for event, data in events if event == "tool_result"}
    calls = []
    for event, data in events:
        if event != "tool_call":
            continue
        use = data.get("tool_use", {})
        done = results.get(str(use.get("id")))
        calls.append(
            ToolCall(
                id=str(use.get("id", "")),
                name=str(use.get("name", "")),
                input=dict(use.get("input") or {}),
                result=str(done.get("text", "")) if done is not None else None,
                is_error=bool(done.get("is_error")) if done is not None else False,
            )
        )
    return tuple(calls)


def _last_text(events: list[Event]) -> str:
    texts = [str(data.get("text", "")) for event, data in events if event == "text"]
    return texts[-1] if texts else ""


def run_agent(client: httpx.Client, agent: str, prompt: str, *, timeout: float = 60.0, **fields: Any) -> Result:
    """Start a run of `agent` (POST /v1/runs, SSE) with `prompt` and any other
    body `fields` (user_id, segments, metadata, max_iterations, ...), follow it
    to its end and return its Result. Past `timeout` seconds the run is
    cancelled and RunTimeout raised; a refused request is a LoomcycleError."""
    if "background" in fields:
        raise ValueError("run_agent streams the run: `background` is not a field it can send")
    collector = _Collector(time.monotonic() + timeout)
    _follow(client, {"agent": agent, "prompt": prompt, **fields}, collector)
    if not collector.finished:
        if collector.agent_id:
            client.post(f"/v1/agents/{collector.agent_id}/cancel", json={"reason": "run_agent timeout"})
        seen = ", ".join(event for event, _ in collector.events) or "none"
        raise RunTimeout(
            f"run {collector.run_id or '?'} of {agent!r} did not end within {timeout:g} s (events: {seen})"
        )
    state, rows = _persisted_events(client, collector.run_id)
    last_event, last_data = collector.events[-1]
    return Result(
        run_id=collector.run_id,
        agent_id=collector.agent_id,
        status=state,
        events=tuple(collector.events),
        text=_last_text(collector.events),
        tool_calls=tool_calls_from(collector.events),
        transcript=transcript_from_events(rows),
        stop_reason=str(last_data.get("stop_reason", "")) if last_event == "done" else "",
        error=str(last_data.get("error", "")) if last_event == "error" else "",
    )


def _get(client: httpx.Client, path: str) -> Any:
    resp = client.get(path)
    if resp.status_code != 200:
        raise _refused(resp, f"GET {path}")
    return resp.json()


def define_agent(client: httpx.Client, name: str, **overlay: Any) -> dict[str, Any]:
    """Make `overlay` the active definition of agent `name` (POST /v1/_agentdef),
    so that runs of `name` by this client's tenant use it. A name with a static
    yaml entry is forked (the overlay merges onto the current version; a None
    value removes a field) and promoted; any other name gets a new version
    with exactly `overlay` (`create`, promoted; identical content returns the
    active row with `deduplicated: true`). Returns the API's row (def_id,
    version, content_sha256, definition, ...).

    In the shared tenant (open mode, the legacy token, admins without a
    tenant) a static yaml entry outranks every runtime version (SPEC 5.1), so
    redefining a static name there is refused with a LoomcycleError instead
    of creating a version no run would use."""
    static = any(row["name"] == name and row.get("static") for row in _get(client, "/v1/_agentdef/names")["names"])
    if static and not _get(client, "/v1/_me").get("tenant_id"):
        raise LoomcycleError(
            f"agent {name!r} is a static yaml entry and this client is in the shared tenant, where the yaml entry "
            "outranks any runtime version: rename the agent, drop it from the yaml, or use a tenant's token"
        )
    body = {"op": "fork" if static else "create", "name": name, "overlay": overlay, "promote": True}
    resp = client.post("/v1/_agentdef", json=body)
    if resp.status_code != 200:
        raise _refused(resp, f"AgentDef {body['op']} {name!r}")
    row: dict[str, Any] = resp.json()
    return row


def _matches(call: ToolCall, expected: dict[str, Any]) -> bool:
    return all(key in call.input and call.input[key] == value for key, value in expected.items())


def assert_tool_called(result: Result, tool: str, **expected: Any) -> ToolCall:
    """Pass when some call of `tool` has every `expected` key with an equal
    value in its input (returns the first such call); otherwise fail with a
    message listing every tool call the run made."""
    for call in result.tool_calls:
        if call.name == tool and _matches(call, expected):
            return call
    made = "\n".join(
        f"  {c.name} {json.dumps(c.input, sort_keys=True)}{' (error)' if c.is_error else ''}" for c in result.tool_calls
    )
    want = f"{tool} with {json.dumps(expected, sort_keys=True)}" if expected else tool
    raise AssertionError(f"no call of {want} in run {result.run_id}; the calls made were:\n{made or '  (none)'}")
