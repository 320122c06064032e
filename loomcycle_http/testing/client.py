"""Helpers over the runtime's HTTP API, through loomcycle_http.client: run an agent and collect
its events, answer an interactive run, define an agent, assert on tool calls.

Invariants:
- Only HTTP, through the client (`loomcycle_http.client.Client`): nothing here imports the
  runtime, and the run's stream is followed by the client's follower (`runs.start`,
  `runs.stream`), the only one in the tree.
- `run_agent` names its run (a client-made `agent_id` when the caller gave none), so the run can
  always be found and cancelled, whatever the transport did. It returns once the run is terminal
  (a `done` or `error` event) or parked (an `awaiting_input` event: `until_input`), or raises
  RunTimeout after cancelling it once the follow's `timeout` has passed (FollowTimeout); a
  dropped or silent stream is re-attached by the client with `Last-Event-ID`, so no event is
  lost or repeated. `send_input` does the same from the last event a turn saw.
- `Result` is frozen, and built from what the server sent: `events` and `tool_calls` from the
  stream, `status`, `stop_reason` and `error` from `GET /v1/runs/{id}`, `transcript` and `text`
  from `GET /v1/runs/{id}/events` (there is no transcript endpoint: the conversation is rebuilt
  from the persisted events, as the engine built it). `text` is read there, not from the stream:
  a stream shows a model call's text as live frames followed by a committed frame carrying only
  the rest (docs/api.md, "Live text"), while the stored event holds the call's whole text.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from loomcycle_http.client import ApiError, Client, ConnectionFailed, Event, FollowTimeout, NotFound
from loomcycle_http.client._base import new_agent_id
from loomcycle_http.client.errors import LoomcycleError as ClientError
from loomcycle_http.testing.transcript import transcript_from_events

PARKED = "awaiting_input"
OPENING = frozenset({"agent", "session"})  # the live-only frames every stream of the run opens with
Frame = tuple[str, dict[str, Any]]


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
    events: tuple[Frame, ...]  # every event the client's follower handed over, in order: (event, data)
    text: str  # the whole text of this call's last model `text` event ("" if the model wrote none)
    tool_calls: tuple[ToolCall, ...]  # in the order the model made them
    transcript: tuple[dict[str, Any], ...]  # {"role", "content": [blocks]}, see transcript.py
    stop_reason: str  # the run's stop_reason (GET /v1/runs/{id}), e.g. end_turn or invalid_mock_script
    error: str  # the run's error, or ""
    last_seq: int  # the seq of the last persisted event seen: send_input follows on from it


def _refused(exc: ApiError, what: str) -> LoomcycleError:
    return LoomcycleError(f"{what}: HTTP {exc.status} {exc.code}: {exc.message}")


@dataclass
class _Turn:
    """What one call saw of its run: the events the follower handed over, and where it started."""

    agent_id: str
    run_id: str = ""
    first_seq: int = 0  # this call's persisted events are those after it
    # A later turn (send_input): the `agent` and `session` frames its stream opens with are not its own.
    resumed: bool = False
    events: tuple[Event, ...] = ()

    @property
    def last_seq(self) -> int:
        return max((e.seq for e in self.events if e.seq is not None), default=self.first_seq)


def _collect(follow: Iterator[Event], turn: _Turn, what: str) -> None:
    """Follow to the end or the turn's end into `turn`; a refusal is a LoomcycleError. FollowTimeout
    propagates with `turn.events` holding what came before it."""
    seen: list[Event] = []
    try:
        for event in follow:
            if turn.resumed and event.type in OPENING:
                continue
            seen.append(event)
            if event.type == "agent" and not turn.run_id:
                turn.run_id = str(event.data.get("run_id") or "")
    except ApiError as exc:
        raise _refused(exc, what) from exc
    finally:
        turn.events = tuple(seen)


def _cancel(client: Client, agent_id: str, reason: str) -> str:
    """Cancel the run; what came of it, for the RunTimeout's message."""
    try:
        answer = client.runs.cancel(agent_id, reason)
    except NotFound:
        return "the runtime has no such run (the POST never reached it, or was refused unseen)"
    except ApiError as exc:
        return f"cancelling it answered HTTP {exc.status} {exc.code}: {exc.message}"
    except ConnectionFailed as exc:
        return f"cancelling it failed: {exc.message}"
    return "cancelled" if answer.get("cancelled") else f"it had just ended ({answer.get('status')})"


def _timed_out(client: Client, turn: _Turn, late: FollowTimeout, what: str, timeout: float, helper: str) -> RunTimeout:
    """Cancel the run and say so; `what` names the run ("of 'agent'", "after the input")."""
    outcome = _cancel(client, turn.agent_id, f"{helper} timeout")
    seen = ", ".join(event.type for event in turn.events) or "none"
    return RunTimeout(
        f"run {turn.run_id or late.run_id or '?'} {what} did not end or reach awaiting_input within {timeout:g} s "
        f"(events: {seen}); agent_id {turn.agent_id}: {outcome}"
    )


def _follow(
    client: Client, follow: Iterator[Event], turn: _Turn, labels: tuple[str, str, str], timeout: float
) -> Result:
    """Collect the turn, then its Result; past the follow's timeout, cancel and raise RunTimeout.
    `labels`: (the request, for a refusal; the run, for a timeout; the helper's name)."""
    request, what, helper = labels
    try:
        _collect(follow, turn, request)
    except FollowTimeout as late:
        raise _timed_out(client, turn, late, what, timeout, helper) from late
    if not turn.run_id:  # the follow ended by asking the run (a stream closed before naming it)
        turn.run_id = str(client.runs.get_by_agent_id(turn.agent_id)["run_id"])
    return _result(client, turn)


def tool_calls_from(events: list[Frame]) -> tuple[ToolCall, ...]:
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


def _result(client: Client, turn: _Turn) -> Result:
    run = _get_run(client, turn.run_id)
    rows = list(client.runs.event_rows(turn.run_id))
    frames = [(event.type, event.data) for event in turn.events]
    return Result(
        run_id=turn.run_id,
        agent_id=str(run["agent_id"]),
        status=PARKED if turn.events and turn.events[-1].type == PARKED else str(run["state"]),
        events=tuple(frames),
        text=_last_text(rows, turn.first_seq),
        tool_calls=tool_calls_from(frames),
        transcript=transcript_from_events(rows),
        stop_reason=str(run.get("stop_reason") or ""),
        error=str(run.get("error") or ""),
        last_seq=turn.last_seq,
    )


def run_agent(client: Client, agent: str, prompt: str, *, timeout: float = 60.0, **fields: Any) -> Result:
    """Start a run of `agent` (POST /v1/runs, SSE) with `prompt` and any other
    body `fields` (user_id, segments, metadata, max_iterations, interactive,
    agent_id, ...), follow it to its end, or to its first `awaiting_input`
    (an interactive run's turn), and return its Result. Without an `agent_id`
    one is made here (`a_<16 hex>`, the server's format). Past `timeout`
    seconds the run is cancelled and RunTimeout raised; a refused request is
    a LoomcycleError."""
    if "background" in fields:
        raise ValueError("run_agent streams the run: `background` is not a field it can send")
    fields["agent_id"] = fields.get("agent_id") or new_agent_id()
    turn = _Turn(agent_id=str(fields["agent_id"]))
    # The outage bound is the deadline: a connection lost for good ends as a RunTimeout too.
    follow = client.runs.start(agent, prompt, reconnect_timeout=timeout, timeout=timeout, until_input=True, **fields)
    return _follow(client, follow, turn, (f"POST /v1/runs {agent!r}", f"of {agent!r}", "run_agent"), timeout)


def send_input(client: Client, run: Result | str, text: str, *, timeout: float = 60.0) -> Result:
    """Answer a run parked at `awaiting_input` (POST /v1/runs/{id}/input), then
    follow its stream from the last event `run` saw (a Result), or from the
    run's last event now (a run id), to the next `awaiting_input` or the end.
    The Result's events are this turn's; its transcript is the whole
    conversation. Past `timeout` seconds the run is cancelled and RunTimeout
    raised; a refused input (a run that is not in flight: 404) is a LoomcycleError."""
    deadline = time.monotonic() + timeout
    if isinstance(run, Result):
        turn = _Turn(agent_id=run.agent_id, run_id=run.run_id, first_seq=run.last_seq, resumed=True)
    else:
        row = _get_run(client, run)
        turn = _Turn(agent_id=str(row["agent_id"]), run_id=run, first_seq=int(row["last_seq"]), resumed=True)
    try:
        client.runs.input(turn.run_id, text)
    except ApiError as exc:
        raise _refused(exc, f"POST /v1/runs/{turn.run_id}/input") from exc
    left = max(0.0, deadline - time.monotonic())
    follow = client.runs.stream(
        turn.run_id, from_seq=turn.first_seq, reconnect_timeout=timeout, timeout=left, until_input=True
    )
    return _follow(
        client, follow, turn, (f"GET /v1/runs/{turn.run_id}/stream", "after the input", "send_input"), timeout
    )


def _get_run(client: Client, run_id: str) -> dict[str, Any]:
    try:
        return dict(client.runs.get(run_id))
    except ApiError as exc:
        raise _refused(exc, f"GET /v1/runs/{run_id}") from exc


def define_agent(client: Client, name: str, **overlay: Any) -> dict[str, Any]:
    """Make `overlay` the active definition of agent `name` (the client's `agents.apply`:
    POST /v1/_agentdef), so that runs of `name` by this client's tenant use it. A name with a
    static yaml entry is forked (the overlay merges onto the current version; a None value removes
    a field) and promoted; any other name gets a new version with exactly `overlay` (`create`,
    promoted; identical content returns the active row with `deduplicated: true`). Returns the
    API's row (def_id, version, content_sha256, definition, ...).

    In the shared tenant (open mode, the legacy token, admins without a tenant) a static yaml
    entry outranks every runtime version (SPEC 5.1), so redefining a static name there is refused
    with a LoomcycleError (the client's `static_in_shared_tenant`) instead of creating a version no
    run would use."""
    try:
        return client.agents.apply(name, overlay)
    except ApiError as exc:
        raise _refused(exc, f"AgentDef {name!r}") from exc
    except ClientError as exc:  # refused before sending (static_in_shared_tenant)
        raise LoomcycleError(exc.message) from exc


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
