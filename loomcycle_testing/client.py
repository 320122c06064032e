"""Helpers over the runtime's HTTP API: run an agent and collect its events,
answer an interactive run, define an agent through the substrate API, assert
on tool calls.

Invariants:
- Only HTTP (httpx): nothing here imports the runtime.
- `run_agent` names its run (a client-made `agent_id` when the caller gave
  none), so the run can always be found and cancelled, whatever the
  transport did. It returns once the run is terminal (a `done` or `error`
  frame) or parked (an `awaiting_input` frame), or raises RunTimeout after
  cancelling it; a dropped or silent stream is re-attached with
  `Last-Event-ID`, so no event is lost or repeated. `send_input` does the
  same from the last event a turn saw.
- `Result` is frozen, and built from what the server sent: `events` and
  `tool_calls` from the stream, `status`, `stop_reason` and `error` from
  `GET /v1/runs/{id}`, `transcript` and `text` from `GET /v1/runs/{id}/events`
  (there is no transcript endpoint: the conversation is rebuilt from the
  persisted events, as the engine built it). `text` is read there, not from
  the stream: a stream shows a model call's text as live frames followed by a
  committed frame carrying only the rest (docs/api.md, "Live text"), while the
  stored event holds the call's whole text.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource

from loomcycle_testing.transcript import transcript_from_events

TERMINAL = frozenset({"done", "error"})
PARKED = "awaiting_input"
MIN_READ_TIMEOUT_S = 2.0  # never wait less for headers or a frame, however near the deadline
CANCEL_TIMEOUT_S = 10.0
LOOKUP_INTERVAL_S = 0.2  # between looks for a run whose POST answer never came
# The connection broke or went silent after the request may have reached the server:
# the run, if it was made, is found again by its agent_id.
_DROPPED = (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout, httpx.RemoteProtocolError, httpx.ReadError)
Event = tuple[str, dict[str, Any]]


class LoomcycleError(AssertionError):
    """The runtime refused a request; the message has its status, code and error."""


class RunTimeout(AssertionError):
    """A run did not end (or park) within the timeout; it was cancelled."""


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
    """A finished run, or an interactive run's turn, as the helpers saw it."""

    run_id: str
    agent_id: str
    status: str  # completed, failed, cancelled, or awaiting_input (the stream stopped at a turn's end)
    events: tuple[Event, ...]  # every SSE frame of this call, in order: (event, data)
    text: str  # the whole text of this call's last model `text` event ("" if the model wrote none)
    tool_calls: tuple[ToolCall, ...]  # in the order the model made them
    transcript: tuple[dict[str, Any], ...]  # {"role", "content": [blocks]}, see transcript.py
    stop_reason: str  # the run's stop_reason (GET /v1/runs/{id}), e.g. end_turn or invalid_mock_script
    error: str  # the run's error, or ""
    last_seq: int  # the seq of the last persisted event seen: send_input follows on from it


def _refused(resp: httpx.Response, what: str) -> LoomcycleError:
    resp.read()
    try:
        body = resp.json()
        detail = f"{body.get('code')}: {body.get('error')}" if isinstance(body, dict) else resp.text
    except ValueError:  # not JSON: show the text as it came
        detail = resp.text[:500]
    return LoomcycleError(f"{what}: HTTP {resp.status_code} {detail}")


def sse_frames(resp: httpx.Response) -> Iterator[tuple[str | None, str, dict[str, Any]]]:
    """(id or None, event, data) per SSE frame; comments (keepalives) skipped. The frames are
    parsed by httpx-sse, the one SSE parser of the project's clients (loomcycle_http uses it too)."""
    for sse in EventSource(resp).iter_sse():
        if sse.event != "message" or sse.data:  # a comment-only block (keepalive) has neither
            yield sse.id or None, sse.event, json.loads(sse.data or "{}")


class _Collector:
    """Frames of one run, across re-attaches, until a terminal or `awaiting_input`
    frame or the deadline. `run_id` is known once an `agent` frame (or the
    caller) named it; every later `agent` frame opens a re-attached stream and
    is skipped."""

    def __init__(self, deadline: float, *, agent_id: str, run_id: str = "", last_seq: int = 0) -> None:
        self.deadline = deadline
        self.events: list[Event] = []
        self.agent_id = agent_id
        self.run_id = run_id
        self.last_id = str(last_seq)
        self.first_seq = last_seq  # this call's persisted events are those after it

    @property
    def stopped(self) -> bool:
        return bool(self.events) and (self.events[-1][0] in TERMINAL or self.events[-1][0] == PARKED)

    @property
    def late(self) -> bool:
        return time.monotonic() >= self.deadline

    def read(self, resp: httpx.Response) -> None:
        for seq, event, data in sse_frames(resp):
            if event == "agent":
                if self.run_id:
                    continue  # a re-attached stream opens with `agent` again
                self.run_id = str(data.get("run_id", ""))
            self.last_id = seq or self.last_id
            self.events.append((event, data))
            if self.stopped or self.late:
                return


def _stream_timeout(deadline: float) -> httpx.Timeout:
    return httpx.Timeout(10.0, read=max(MIN_READ_TIMEOUT_S, deadline - time.monotonic()))


def _post(client: httpx.Client, body: dict[str, Any], collector: _Collector) -> None:
    """POST the run and read its stream. A connection that breaks or goes silent
    is left to `_reattach`; a refusal is a LoomcycleError; a connection that
    never opened (nothing was sent) is raised as httpx raised it."""
    try:
        with client.stream("POST", "/v1/runs", json=body, timeout=_stream_timeout(collector.deadline)) as resp:
            if resp.status_code != 200:
                raise _refused(resp, f"POST /v1/runs {body.get('agent')!r}")
            collector.read(resp)
    except _DROPPED:
        return  # the run, if the server made it, is found by its agent_id


def _find_run(client: httpx.Client, collector: _Collector) -> None:
    """Learn the run_id of `collector.agent_id` when no stream has named it (the
    POST's answer never came); a run not there yet is looked for again."""
    try:
        resp = client.get(f"/v1/agents/{collector.agent_id}", timeout=_stream_timeout(collector.deadline))
    except _DROPPED:
        return  # the loop looks again until the deadline
    if resp.status_code == 404:  # not made (yet): the POST may still be on its way
        time.sleep(max(0.0, min(LOOKUP_INTERVAL_S, collector.deadline - time.monotonic())))
        return
    if resp.status_code != 200:
        raise _refused(resp, f"GET /v1/agents/{collector.agent_id}")
    collector.run_id = str(resp.json()["run_id"])


def _reattach(client: httpx.Client, collector: _Collector) -> None:
    """One GET /v1/runs/{id}/stream from the last seq seen (finding the run first if need be)."""
    if not collector.run_id:
        _find_run(client, collector)
        return
    path = f"/v1/runs/{collector.run_id}/stream"
    headers = {"Last-Event-ID": collector.last_id}
    try:
        with client.stream("GET", path, headers=headers, timeout=_stream_timeout(collector.deadline)) as resp:
            if resp.status_code != 200:
                raise _refused(resp, f"GET {path}")
            collector.read(resp)
    except _DROPPED:
        return  # dropped or silent: the caller's loop decides by the deadline


def _follow(client: httpx.Client, collector: _Collector) -> None:
    while not collector.stopped and not collector.late:
        _reattach(client, collector)


def _cancel(client: httpx.Client, agent_id: str, reason: str) -> str:
    """Cancel the run; what came of it, for the RunTimeout's message."""
    try:
        resp = client.post(f"/v1/agents/{agent_id}/cancel", json={"reason": reason}, timeout=CANCEL_TIMEOUT_S)
    except httpx.TransportError as exc:
        return f"cancelling it failed: {exc!r}"
    if resp.status_code == 404:
        return "the runtime has no such run (the POST never reached it, or was refused unseen)"
    if resp.status_code != 200:
        return f"cancelling it answered HTTP {resp.status_code} {resp.text[:300]}"
    answer = resp.json()
    return "cancelled" if answer.get("cancelled") else f"it had just ended ({answer.get('status')})"


def _timed_out(client: httpx.Client, collector: _Collector, what: str, timeout: float, helper: str) -> RunTimeout:
    """Cancel the run and say so; `what` names the run ("of 'agent'", "after the input")."""
    outcome = _cancel(client, collector.agent_id, f"{helper} timeout")
    seen = ", ".join(event for event, _ in collector.events) or "none"
    return RunTimeout(
        f"run {collector.run_id or '?'} {what} did not end or reach awaiting_input within {timeout:g} s "
        f"(events: {seen}); agent_id {collector.agent_id}: {outcome}"
    )


def _persisted_events(client: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    """Every persisted event of the run, through GET /v1/runs/{id}/events, page by page."""
    rows: list[dict[str, Any]] = []
    while True:
        after = rows[-1]["seq"] if rows else 0
        resp = client.get(f"/v1/runs/{run_id}/events", params={"from_seq": after, "limit": 5000})
        if resp.status_code != 200:
            raise _refused(resp, f"GET /v1/runs/{run_id}/events")
        page = resp.json()
        rows.extend(page["events"])
        if not page["events"] or rows[-1]["seq"] >= page["last_seq"]:
            return rows


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


def _last_text(rows: list[dict[str, Any]], after_seq: int) -> str:
    """The stored text of the last model `text` event after `after_seq` (whole, unlike the stream's
    committed frame, which carries only what the live frames had not shown)."""
    texts = [str(row["payload"].get("text", "")) for row in rows if row["type"] == "text" and row["seq"] > after_seq]
    return texts[-1] if texts else ""


def _result(client: httpx.Client, collector: _Collector) -> Result:
    run = _get(client, f"/v1/runs/{collector.run_id}")
    parked = collector.events[-1][0] == PARKED
    rows = _persisted_events(client, collector.run_id)
    return Result(
        run_id=collector.run_id,
        agent_id=str(run["agent_id"]),
        status=PARKED if parked else str(run["state"]),
        events=tuple(collector.events),
        text=_last_text(rows, collector.first_seq),
        tool_calls=tool_calls_from(collector.events),
        transcript=transcript_from_events(rows),
        stop_reason=str(run.get("stop_reason") or ""),
        error=str(run.get("error") or ""),
        last_seq=int(collector.last_id),
    )


def run_agent(client: httpx.Client, agent: str, prompt: str, *, timeout: float = 60.0, **fields: Any) -> Result:
    """Start a run of `agent` (POST /v1/runs, SSE) with `prompt` and any other
    body `fields` (user_id, segments, metadata, max_iterations, interactive,
    agent_id, ...), follow it to its end, or to its first `awaiting_input`
    (an interactive run's turn), and return its Result. Without an `agent_id`
    one is made here (`a_<16 hex>`, the server's format). Past `timeout`
    seconds the run is cancelled and RunTimeout raised; a refused request is
    a LoomcycleError."""
    if "background" in fields:
        raise ValueError("run_agent streams the run: `background` is not a field it can send")
    body = {"agent": agent, "prompt": prompt, **fields}
    if not body.get("agent_id"):
        body["agent_id"] = f"a_{secrets.token_hex(8)}"
    collector = _Collector(time.monotonic() + timeout, agent_id=str(body["agent_id"]))
    _post(client, body, collector)
    _follow(client, collector)
    if not collector.stopped:
        raise _timed_out(client, collector, f"of {agent!r}", timeout, "run_agent")
    return _result(client, collector)


def send_input(client: httpx.Client, run: Result | str, text: str, *, timeout: float = 60.0) -> Result:
    """Answer a run parked at `awaiting_input` (POST /v1/runs/{id}/input), then
    follow its stream from the last event `run` saw (a Result), or from the
    run's last event now (a run id), to the next `awaiting_input` or the end.
    The Result's events are this turn's; its transcript is the whole
    conversation. Past `timeout` seconds the run is cancelled and RunTimeout
    raised; a refused input (a run that is not in flight: 404) is a LoomcycleError."""
    deadline = time.monotonic() + timeout
    if isinstance(run, Result):
        run_id, agent_id, last_seq = run.run_id, run.agent_id, run.last_seq
    else:
        row = _get(client, f"/v1/runs/{run}")
        run_id, agent_id, last_seq = run, str(row["agent_id"]), int(row["last_seq"])
    resp = client.post(f"/v1/runs/{run_id}/input", json={"text": text})
    if resp.status_code != 200:
        raise _refused(resp, f"POST /v1/runs/{run_id}/input")
    collector = _Collector(deadline, agent_id=agent_id, run_id=run_id, last_seq=last_seq)
    _follow(client, collector)
    if not collector.stopped:
        raise _timed_out(client, collector, "after the input", timeout, "send_input")
    return _result(client, collector)


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
