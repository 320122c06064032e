"""The `mock-script` model as a provider (issue 17, part 1): every step kind,
how the step index is found, determinism, and malformed scripts. The same
scripts through real runs are in tests/runs/test_mock_script.py."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from apps.gateway.providers.base import (
    Done,
    ProviderCancelled,
    ProviderError,
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolSpec,
)
from apps.gateway.providers.mock import MockProvider

MODEL = "mock-script?latency_ms=0&jitter_ms=0"
TOOLS = [ToolSpec("Context", "who am I", {}), ToolSpec("Memory", "remember", {})]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def script(steps: Any, before: str = "Do it. ") -> dict[str, Any]:
    return user(before + "MOCK_SCRIPT: " + json.dumps(steps) + " (trailing words are ignored)")


def turn(i: int, *results: str) -> list[dict[str, Any]]:
    """An assistant turn of tool uses and the user message with their results."""
    uses = [{"type": "tool_use", "id": f"t{i}_{n}", "name": "Context", "input": {}} for n in range(len(results))]
    res = [{"type": "tool_result", "tool_use_id": f"t{i}_{n}", "content": r} for n, r in enumerate(results)]
    return [{"role": "assistant", "content": uses}, {"role": "user", "content": res}]


def play(messages: list[dict[str, Any]], *, stable: bool = False, run_id: str = "r_1", **kw: Any) -> list[Any]:
    provider = MockProvider("mock-stable" if stable else "mock", stable=stable)
    req = ProviderRequest(
        model=MODEL, system=kw.pop("system", ["be terse"]), messages=messages, tools=TOOLS, run_id=run_id
    )
    return list(provider.stream(req, kw.pop("cancel", threading.Event())))


def parts(events: list[ProviderEvent]) -> tuple[str, list[tuple[str, dict[str, Any]]], str]:
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [(e.name, e.input) for e in events if isinstance(e, ToolCall)]
    done = events[-1]
    assert isinstance(done, Done)
    return text, calls, done.stop_reason


def test_a_tool_step_then_a_text_step_then_ok_past_the_end() -> None:
    steps = [{"tool": "Memory", "input": {"op": "set", "key": "k"}}, {"text": "saved"}]
    first = [script(steps)]
    assert parts(play(first)) == ("", [("Memory", {"op": "set", "key": "k"})], "tool_use")
    second = first + turn(0, "stored")
    assert parts(play(second)) == ("saved", [], "end_turn")
    third = [*second, {"role": "assistant", "content": [{"type": "text", "text": "saved"}]}, user("and now?")]
    assert parts(play(third)) == ("ok", [], "end_turn")


def test_parallel_tools_are_one_step_and_text_may_come_first() -> None:
    steps = [
        {"text": "two at once", "tools": [{"tool": "Context", "input": {"op": "self"}}, {"tool": "Memory"}]},
        {"text": "done"},
    ]
    events = play([script(steps)])
    assert parts(events) == ("two at once", [("Context", {"op": "self"}), ("Memory", {})], "tool_use")
    assert parts(play([script(steps), *turn(0, "a", "b")]))[0] == "done"  # two results, still the next step


def test_text_with_a_tool_says_the_text_then_calls() -> None:
    events = play([script([{"text": "looking", "tool": "Context", "input": {"op": "time"}}])])
    assert [type(e) for e in events] == [TextDelta, ToolCall, Done]


def test_a_new_user_script_starts_at_step_zero_and_the_system_prompt_is_the_fallback() -> None:
    old = [script([{"tool": "Context"}, {"text": "old script"}]), *turn(0, "r")]
    newer = [*old, script([{"text": "new script"}], before="Change of plan. ")]
    assert parts(play(newer))[0] == "new script"
    system = ["You are a bot. MOCK_SCRIPT: [" + json.dumps({"text": "from system"}) + "]"]
    assert parts(play([user("no marker here")], system=system))[0] == "from system"


def test_echo_describes_the_request_exactly() -> None:
    messages = [script([{"tool": "Context"}, {"echo": True}]), *turn(0, "r")]
    text, calls, stop = parts(play(messages, system=["first", "second"]))
    assert (calls, stop) == ([], "end_turn")
    seen = json.loads(text)
    assert seen["system"] == "first\n\nsecond"
    assert seen["tools"] == ["Context", "Memory"]
    assert [m["role"] for m in seen["messages"]] == ["user", "assistant", "user"]
    assert seen["messages"][0]["text"].startswith("Do it. MOCK_SCRIPT: ")
    assert seen["messages"][1]["text"] == seen["messages"][2]["text"] == ""  # tool blocks carry no text
    assert text == json.dumps(seen, separators=(",", ":"))  # compact


def test_repeat_plays_the_last_step_for_every_later_index() -> None:
    steps = [{"text": "first", "tool": "Context"}, {"tool": "Memory", "input": {"op": "incr"}, "repeat": True}]
    messages = [script(steps)]
    for i in range(4):
        messages += turn(i, "r")
        assert parts(play(messages))[1] == [("Memory", {"op": "incr"})]


def test_tool_ids_are_deterministic_per_run_turn_and_index() -> None:
    messages = [script([{"tools": [{"tool": "Context"}, {"tool": "Context"}]}])]

    def ids(run_id: str) -> list[str]:
        return [e.id for e in play(messages, run_id=run_id) if isinstance(e, ToolCall)]

    assert ids("r_1") == ids("r_1")
    assert ids("r_1") != ids("r_2")
    assert len(set(ids("r_1"))) == 2
    assert all(i.startswith("mock_tu_") and len(i) == len("mock_tu_") + 16 for i in ids("r_1"))


def test_a_step_that_would_answer_nothing_answers_ok_so_the_next_turn_moves_on() -> None:
    steps = [{"text": ""}, {"error": 429}, {"text": "third"}]
    first = [script(steps)]
    assert parts(play(first)) == ("ok", [], "end_turn")
    second = [*first, {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}, user("next")]
    assert parts(play(second, stable=True))[0] == "ok"  # mock-stable ignores the error: nothing else to say
    third = [*second, {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}, user("next")]
    assert parts(play(third))[0] == "third"


def test_usage_is_the_mocks_with_at_least_one_output_token() -> None:
    done = play([script([{"text": "hi"}])])[-1]
    assert isinstance(done, Done)
    assert done.usage.output_tokens == 1
    assert done.usage.input_tokens >= 1
    long = play([script([{"text": "x" * 400}])])[-1]
    assert isinstance(long, Done) and long.usage.output_tokens == 100


@pytest.mark.parametrize(("error", "status"), [(429, 429), (500, 500), ("overloaded", 529)])
def test_a_scripted_error_fails_the_call_retryably_on_mock_only(error: Any, status: int) -> None:
    messages = [script([{"text": "after the failure", "error": error}])]
    with pytest.raises(ProviderError) as exc:
        play(messages)
    assert (exc.value.status, exc.value.retryable) == (status, True)
    assert str(exc.value).startswith(f"mock {status}: ")
    assert parts(play(messages, stable=True))[0] == "after the failure"  # mock-stable never fails


def test_sleep_is_cancel_aware() -> None:
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(ProviderCancelled):
        play([script([{"text": "late", "sleep_ms": 60_000}])], cancel=cancel)
    assert time.monotonic() - started < 2.0


def test_hold_streams_the_output_then_a_cancel_cuts_the_turn_before_it_ends() -> None:
    cancel = threading.Event()
    steps = [{"text": "so far", "tool": "Context", "input": {"op": "time"}, "hold_ms": 60_000}]
    req = ProviderRequest(model=MODEL, system=[], messages=[script(steps)], tools=TOOLS, run_id="r_1")
    stream = MockProvider("mock").stream(req, cancel)
    first, second = next(stream), next(stream)
    assert isinstance(first, TextDelta) and first.text == "so far"
    assert isinstance(second, ToolCall) and (second.name, second.input) == ("Context", {"op": "time"})
    cancel.set()  # during the hold: the turn's output is out, its Done never comes
    with pytest.raises(ProviderCancelled):
        next(stream)


def test_the_gateway_path_plays_the_same_script() -> None:
    import asyncio

    async def collect() -> list[ProviderEvent]:
        req = ProviderRequest(model=MODEL, system=[], messages=[script([{"text": "hi", "sleep_ms": 10}])])
        return [e async for e in MockProvider("mock").astream(req)]

    assert parts(asyncio.run(collect()))[0] == "hi"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("[{]", "is not JSON"),
        ('{"text": "hi"}', "must be a JSON array"),
        ('[{"tol": "Memory"}]', "step 0: unknown key 'tol'"),
        ('[{"text": "a"}, "b"]', "step 1 must be an object"),
        ('[{"tool": "A", "tools": [{"tool": "B"}]}]', "either tool or tools"),
        ('[{"tool": "A", "input": []}]', "input must be an object"),
        ('[{"tools": []}]', "tools must be a non-empty array"),
        ('[{"echo": true, "text": "x"}]', "echo answers alone"),
        ('[{"text": "a", "repeat": true}, {"text": "b"}]', "last step only"),
        ('[{"text": "a", "sleep_ms": -1}]', "sleep_ms must be"),
        ('[{"text": "a", "hold_ms": 300001}]', "hold_ms must be"),
        ('[{"text": "a", "error": 404}]', "error must be 429, 500"),
        ('[{"text": "a", "error": []}]', "error must be 429, 500"),
        ('[{"text": "a", "error": {}}]', "error must be 429, 500"),
        ("[" * 100_000, "nested too deeply"),
        ('[{"text": "a\\u0000b"}]', "cannot be stored: NUL"),
        ('[{"tool": "Memory", "input": {"key": "\\ud800"}}]', "cannot be stored"),
        (
            "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
            "cannot be stored",
        ),
    ],
)
def test_a_malformed_script_is_a_clear_non_retryable_error(body: str, needle: str) -> None:
    with pytest.raises(ProviderError) as exc:
        play([user("MOCK_SCRIPT: " + body)])
    assert (exc.value.status, exc.value.retryable, exc.value.stop_reason) == (400, False, "invalid_mock_script")
    assert needle in str(exc.value)
    assert str(exc.value).startswith("mock 400: mock-script: ")


def test_no_marker_anywhere_is_an_error_too() -> None:
    with pytest.raises(ProviderError, match="no MOCK_SCRIPT: marker"):
        play([user("hello")])


def test_a_steps_thinking_streams_in_pieces_before_its_text_and_is_the_turns_thinking_block() -> None:
    events = play([script([{"thinking": "step by step", "text": "done", "chunk_chars": 5}])])
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["ThinkingDelta"] * 3 + ["TextDelta", "Done"]
    assert "".join(e.text for e in events if isinstance(e, ThinkingDelta)) == "step by step"
    done = events[-1]
    assert isinstance(done, Done) and [b["thinking"] for b in done.thinking] == ["step by step"]
    with pytest.raises(ProviderError, match="text and thinking must be strings"):
        play([script([{"thinking": 3}])])
