"""The `mock-script` model: a test writes the model's answers into its prompt.

The script is the first JSON value after `MOCK_SCRIPT:` in the most recent
user text that has the marker, else in the system prompt: an array of steps.
The step played is the number of model turns (assistant messages) after that
text, so a new user turn with a new script starts at step 0, a step with
parallel tool calls is one step, and an interactive run's next turn plays the
next step. Past the end: text "ok", end_turn; a last step with `"repeat":
true` is played for every later index. A step that would answer nothing (no
text and no tool call) answers "ok": every call leaves a model turn.

A step: `tool` + `input` (one tool_use), `tools` (a list of those: parallel
calls), `text` (alone: end_turn; with `tool`/`tools`: said first), `echo`
(the request as compact JSON), and on any step `sleep_ms` (waited, cancel-
aware), `hold_ms` (the turn's text and tool calls are streamed, then it is
held open this long before it ends, cancel-aware: a cancel meanwhile cuts a
turn whose output is already out), `error` (429 | 500 | "overloaded": the call fails like an injected
failure; `mock-stable` never fails, so it plays the rest of the step), and `chunk_chars` with
`chunk_ms` (the text is streamed in pieces of `chunk_chars` characters, `chunk_ms` apart,
cancel-aware; apps.gateway.providers.mock_chunks records each piece's send time), with
`break_after_chars` (the stream breaks, a retryable 500, once that many characters are out;
`mock-stable` never breaks), and `thinking` (reasoning streamed before the text, in pieces
like it, and replayed as the turn's thinking block).

Everything here is a pure function of the request: the same request gives the
same answer, tool ids included (derived from the run id, the number of
messages and the call's index).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from apps.core.errors import Invalid
from apps.core.http import check_storable
from apps.gateway.providers.base import ProviderError, ProviderRequest, ToolCall

MARKER = "MOCK_SCRIPT:"
STOP_REASON_INVALID = "invalid_mock_script"
MAX_SLEEP_MS = 300_000
STEP_KEYS = frozenset(
    {
        "tool",
        "input",
        "tools",
        "text",
        "echo",
        "sleep_ms",
        "hold_ms",
        "error",
        "repeat",
        "chunk_chars",
        "chunk_ms",
        "break_after_chars",
        "thinking",
    }
)
MAX_CHUNK_CHARS = 1_000_000
# error value -> (HTTP status, message), as the mock's injected failures read.
ERRORS: dict[Any, tuple[int, str]] = {
    429: (429, "rate_limited (scripted)"),
    500: (500, "server_error (scripted)"),
    "overloaded": (529, "overloaded_error (scripted)"),
}


class ScriptError(ValueError):
    """The script is not what the grammar above allows; the message says where."""


@dataclass(frozen=True)
class Step:
    text: str = ""
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    echo: bool = False
    sleep_ms: int = 0
    hold_ms: int = 0
    error: Any = None
    repeat: bool = False
    chunk_chars: int = 0
    chunk_ms: int = 0
    break_after_chars: int = 0
    thinking: str = ""


@dataclass(frozen=True)
class Answer:
    """What one call answers: text, tool calls, how long to wait first, and a failure to raise after the wait."""

    text: str
    calls: list[ToolCall]
    sleep_s: float
    error: ProviderError | None
    hold_s: float = 0.0  # after the text and tool calls, before the turn's end
    chunk_chars: int = 0  # the text streamed in pieces of this many characters (0: one piece)
    chunk_s: float = 0.0  # between two pieces
    break_after: int = 0  # the stream breaks (a 500) once this many characters are out (0: never)
    thinking: str = ""  # reasoning streamed before the text (in pieces like it), replayed as a thinking block


def answer(provider_id: str, request: ProviderRequest, *, stable: bool) -> Answer:
    """The answer to `request`; raises ProviderError (400, stop reason
    `invalid_mock_script`) for a script that does not parse."""
    try:
        found = find_script(request)
        if found is None:
            raise ScriptError(f"no {MARKER} marker in the user messages or the system prompt")
        steps, after = found
        step = pick(steps, turns_after(request.messages, after))
    except ScriptError as exc:
        raise ProviderError(provider_id, 400, f"mock-script: {exc}", stop_reason=STOP_REASON_INVALID) from exc
    error = None
    if step.error is not None and not stable:
        status, message = ERRORS[step.error]
        error = ProviderError(provider_id, status, message, retry_after=0.1 if status == 429 else None)
    text = echo_text(request) if step.echo else step.text
    calls = [ToolCall(tool_id(request, i), name, dict(args)) for i, (name, args) in enumerate(step.calls)]
    # An empty answer would leave no model turn in the transcript, so the next call would play this step again.
    return Answer(
        text or ("" if calls else "ok"),
        calls,
        step.sleep_ms / 1000.0,
        error,
        step.hold_ms / 1000.0,
        step.chunk_chars,
        step.chunk_ms / 1000.0,
        0 if stable else step.break_after_chars,
        step.thinking,
    )


# --- finding and parsing the script -------------------------------------------------------


def find_script(request: ProviderRequest) -> tuple[list[Step], int | None] | None:
    """(steps, index of the message holding the marker) — None as the index
    when the script is in the system prompt; None when there is no marker."""
    for index in range(len(request.messages) - 1, -1, -1):
        message = request.messages[index]
        if message["role"] != "user":
            continue
        for block in reversed(message["content"]):
            if block.get("type") == "text" and MARKER in str(block.get("text", "")):
                return parse(str(block["text"])), index
    system = "\n\n".join(request.system)
    if MARKER in system:
        return parse(system), None
    return None


def parse(text: str) -> list[Step]:
    """The steps of the first JSON value after the first marker in `text`."""
    start = text.index(MARKER) + len(MARKER)
    body = text[start:].lstrip()
    try:
        value, _ = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as exc:
        raise ScriptError(f"the script after {MARKER} is not JSON: {exc.msg} at character {exc.pos}") from exc
    except RecursionError as exc:
        raise ScriptError(f"the script after {MARKER} is nested too deeply") from exc
    if not isinstance(value, list):
        raise ScriptError(f"the script must be a JSON array of steps, got {type(value).__name__}")
    try:
        check_storable(value)  # what the transcript could not keep (NUL, lone surrogates, depth > 64)
    except Invalid as exc:
        raise ScriptError(f"the script cannot be stored: {exc.message}") from exc
    return [_step(raw, n, last=n == len(value) - 1) for n, raw in enumerate(value)]


def _step(raw: Any, n: int, *, last: bool) -> Step:
    where = f"step {n}"
    if not isinstance(raw, dict):
        raise ScriptError(f"{where} must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - STEP_KEYS)
    if unknown:
        raise ScriptError(f"{where}: unknown key {unknown[0]!r} (a step has {', '.join(sorted(STEP_KEYS))})")
    if "tool" in raw and "tools" in raw:
        raise ScriptError(f"{where}: give either tool or tools, not both")
    if "input" in raw and "tool" not in raw:
        raise ScriptError(f"{where}: input belongs to tool")
    echo = raw.get("echo", False)
    if not isinstance(echo, bool):
        raise ScriptError(f"{where}: echo must be true or false")
    if echo and ({"tool", "tools", "text"} & set(raw)):
        raise ScriptError(f"{where}: echo answers alone (no text, tool or tools)")
    repeat = raw.get("repeat", False)
    if not isinstance(repeat, bool) or (repeat and not last):
        raise ScriptError(f"{where}: repeat: true is allowed on the last step only")
    text = raw.get("text", "")
    if not isinstance(text, str) or not isinstance(raw.get("thinking", ""), str):
        raise ScriptError(f"{where}: text and thinking must be strings")
    return Step(
        text=text,
        calls=_calls(raw, where),
        echo=echo,
        sleep_ms=_sleep_ms(raw.get("sleep_ms", 0), where),
        hold_ms=_sleep_ms(raw.get("hold_ms", 0), where, key="hold_ms"),
        error=_error(raw.get("error"), where),
        repeat=repeat,
        chunk_chars=_count(raw.get("chunk_chars", 0), where),
        chunk_ms=_sleep_ms(raw.get("chunk_ms", 0), where, key="chunk_ms"),
        break_after_chars=_count(raw.get("break_after_chars", 0), where, key="break_after_chars"),
        thinking=raw.get("thinking", ""),
    )


def _count(value: Any, where: str, *, key: str = "chunk_chars") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CHUNK_CHARS:
        raise ScriptError(f"{where}: {key} must be a whole number from 0 to {MAX_CHUNK_CHARS}")
    return value


def _calls(raw: dict[str, Any], where: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    if "tool" in raw:
        return (_call(raw, where),)
    if "tools" not in raw:
        return ()
    tools = raw["tools"]
    if not isinstance(tools, list) or not tools:
        raise ScriptError(f"{where}: tools must be a non-empty array of {{tool, input}} objects")
    out = []
    for i, item in enumerate(tools):
        if not isinstance(item, dict) or set(item) - {"tool", "input"} or "tool" not in item:
            raise ScriptError(f"{where}: tools[{i}] must be an object with tool and an optional input")
        out.append(_call(item, f"{where}: tools[{i}]"))
    return tuple(out)


def _call(raw: dict[str, Any], where: str) -> tuple[str, dict[str, Any]]:
    name, args = raw["tool"], raw.get("input", {})
    if not isinstance(name, str) or not name:
        raise ScriptError(f"{where}: tool must be a tool's name")
    if not isinstance(args, dict):
        raise ScriptError(f"{where}: input must be an object")
    return name, args


def _sleep_ms(value: Any, where: str, *, key: str = "sleep_ms") -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_SLEEP_MS:
        raise ScriptError(f"{where}: {key} must be a number of milliseconds from 0 to {MAX_SLEEP_MS}")
    return int(value)


def _error(value: Any, where: str) -> Any:
    if value is None:
        return None
    if not isinstance(value, int | str) or isinstance(value, bool) or value not in ERRORS:
        raise ScriptError(f'{where}: error must be 429, 500 or "overloaded", got {json.dumps(value)[:40]}')
    return value


# --- playing it ------------------------------------------------------------------------------


def turns_after(messages: list[dict[str, Any]], index: int | None) -> int:
    """Model turns (assistant messages) after message `index` (all of them when None)."""
    start = 0 if index is None else index + 1
    return sum(1 for m in messages[start:] if m["role"] == "assistant")


def pick(steps: list[Step], index: int) -> Step:
    if index < len(steps):
        return steps[index]
    if steps and steps[-1].repeat:
        return steps[-1]
    return Step(text="ok")


def tool_id(request: ProviderRequest, i: int) -> str:
    """`mock_tu_<16 hex>` from the run, the conversation's length and the call's index."""
    seed = f"{request.run_id}:{len(request.messages)}:{i}"
    return "mock_tu_" + hashlib.sha256(seed.encode()).hexdigest()[:16]


def summary_text(request: ProviderRequest) -> str:
    """A compaction summary (`request.purpose` is PURPOSE_COMPACTION), the same for
    the same request: how many characters of conversation it was given and the
    first 16 hex of their SHA-256. Never a `MOCK_SCRIPT:` marker: the kept turns'
    scripts are the ones that play after a compaction."""
    text = "\n".join(str(b.get("text", "")) for m in request.messages for b in m["content"] if b.get("type") == "text")
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"[mock summary] {len(text)} characters of conversation, sha256 {digest}"


def echo_text(request: ProviderRequest) -> str:
    """The request as compact JSON: system, offered tool names, each message's role and text."""
    messages = [
        {
            "role": m["role"],
            "text": "\n".join(str(b.get("text", "")) for b in m["content"] if b.get("type") == "text"),
        }
        for m in request.messages
    ]
    doc = {"system": "\n\n".join(request.system), "tools": [t.name for t in request.tools], "messages": messages}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
