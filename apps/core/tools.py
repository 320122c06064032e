"""The tool base type shared by every app that contributes agent-facing tools.

A tool is a name, a description, a JSON schema for its input and an execute
function. Tools never raise for expected failures: they return
`ToolResult(is_error=True)` and the model sees the message. An unexpected
exception is turned into an `is_error` result by the engine as well, so a
tool can never crash a run.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import close_old_connections, connection

from apps.core.errors import ApplicationError


@dataclass(frozen=True)
class SpawnRequest:
    """A tool asks the engine to run a sub-agent; its result arrives when the child ends."""

    agent: str
    prompt: str


@dataclass(frozen=True)
class Park:
    """A tool asks the engine to park the run until something answers this call
    (a Channel subscribe/await with nothing to read yet, an Interruption ask). No
    worker waits; the result's `events` are appended in the parked step:

    - `record(run_id, step, call_id)` runs inside the step-commit transaction,
      so the wait exists iff the parked step commits;
    - `after_commit(run_id, call_id)` runs once that commit is visible, and
      answers the call at once if what it waits for arrived in between (a
      publisher that committed first could not have seen the wait);
    - whoever answers later does it through `apps.runs.wake.run_answer`;
    - `abandon()`, when set, runs if the step drops the park instead of committing
      it (a lost fence, a cancel): it gives back what the tool took before the
      commit (the fairness slots of a parallel_spawn's or resident open's children).
    """

    status: str  # the run's status while parked, e.g. "waiting_channel"
    record: Callable[[str, int, str], None]
    after_commit: Callable[[str, str], None]
    abandon: Callable[[], None] | None = None


@dataclass(frozen=True)
class ToolResult:
    text: str
    is_error: bool = False
    spawn: SpawnRequest | None = None
    park: Park | None = None
    events: tuple[dict[str, Any], ...] = ()  # extra run events, emitted before the tool_result


@dataclass(frozen=True)
class VolumeBinding:
    """One volume a run may use (resolved when the run is created, persisted on
    the run row as `as_dict()`). `path` is the host directory; for an ephemeral
    volume it is derived from `root_run_id` (the top-level run) when used."""

    name: str
    path: str
    mode: str  # "ro" | "rw"
    default: bool = False
    ephemeral: bool = False
    root_run_id: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "mode": self.mode,
            "default": self.default,
            "ephemeral": self.ephemeral,
            "root_run_id": self.root_run_id,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> VolumeBinding:
        return cls(
            name=str(raw["name"]),
            path=str(raw.get("path") or ""),
            mode=str(raw.get("mode") or "ro"),
            default=bool(raw.get("default")),
            ephemeral=bool(raw.get("ephemeral")),
            root_run_id=str(raw.get("root_run_id") or ""),
        )


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call. `idempotency_key` is
    `(run_id, step, call_id)`: a redelivered iteration repeats the same key.
    `allowed_hosts` is where the network tools may go (`()`: nowhere)."""

    run_id: str
    agent_id: str
    session_id: str
    tenant_id: str
    user_id: str
    agent_name: str
    agent_def_id: str
    agent_def_sha256: str
    provider: str
    model: str
    step: int
    call_id: str
    tools: tuple[str, ...]
    credentials: Mapping[str, str] = field(
        default_factory=dict, compare=False, repr=False
    )  # user_bearer + user_credentials, never persisted in clear
    volumes: tuple[VolumeBinding, ...] = ()  # the run's resolved volume bindings (none: no filesystem)
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False)
    # The run's effective network hosts (apps.core.hosts.run_allowed_hosts), fixed at run creation.
    allowed_hosts: tuple[str, ...] = ()
    # WebSearch's host filter: "" when the caller did not narrow allowed_hosts, else drop | keep.
    web_search_filter: str = ""
    # This step's tool calls in the order the model made them: (call_id, name, input).
    batch: tuple[tuple[str, str, Mapping[str, Any]], ...] = field(default=(), compare=False, repr=False)

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{self.step}:{self.call_id}"


ToolFn = Callable[[ToolContext, dict[str, Any]], ToolResult]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    execute: ToolFn
    operator_only: bool = False  # Bash, host tools: apps.core.privileged decides who may use them


def input_refusal(data: dict[str, Any], ops: tuple[str, ...], fields: frozenset[str]) -> ToolResult | None:
    """The is_error result for an op-dispatch tool's input with an unknown `op`
    or unknown fields (refused, never silently dropped); None when it is fine."""
    op = data.get("op")
    if op not in ops:
        return ToolResult(f"unknown op {op!r}; this runtime supports {', '.join(ops)}", is_error=True)
    unknown = sorted(set(data) - fields)
    if unknown:
        return ToolResult(f"unknown fields {unknown}", is_error=True)
    return None


class ToolRefusal(Exception):
    """An input an op-dispatch tool refuses; its text is the is_error result."""


def tool_error_text(exc: ApplicationError) -> str:
    """The one text every agent tool gives for a service error: `<code>: <message>`."""
    return f"{exc.code}: {exc.message}"


def db_tool_result(
    call: Callable[[], dict[str, Any] | ToolResult], *, refusals: tuple[type[Exception], ...] = ()
) -> ToolResult:
    """Run one tool op against the database on a worker thread: a ToolRefusal (or one of
    the tool's own `refusals`, read as its message) or an ApplicationError (quota, size,
    unknown row...: `tool_error_text`) becomes an is_error result the model reads; the
    connection goes back to the pool either way. A dict is the JSON result; a ToolResult
    (events, a park) is returned as it is."""
    close_old_connections()
    try:
        out = call()
    except ToolRefusal as exc:
        return ToolResult(str(exc), is_error=True)
    except refusals as exc:  # checked before ApplicationError: a quota refusal is one of those too
        return ToolResult(str(getattr(exc, "message", exc)), is_error=True)
    except ApplicationError as exc:
        return ToolResult(tool_error_text(exc), is_error=True)
    finally:
        connection.close()
    return out if isinstance(out, ToolResult) else ToolResult(json.dumps(out))


def op_tool_result(
    data: dict[str, Any],
    *,
    ops: tuple[str, ...],
    fields: frozenset[str],
    run: Callable[[str], dict[str, Any] | ToolResult],
) -> ToolResult:
    """The shell of every op-dispatch tool (Memory, Evaluation, Channel): refuse an unknown
    op or field, then `run(op)` through `db_tool_result`, so all report errors alike."""
    refused = input_refusal(data, ops, fields)
    if refused is not None:
        return refused
    op = str(data["op"])
    return db_tool_result(lambda: run(op))
