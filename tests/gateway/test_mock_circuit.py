"""The mock provider's circuit roles (SPEC 7.5): researcher, editor,
evaluator and mem-search, played step by step over hand-built transcripts
shaped like apps/runs/prompt.py builds them (tool_result content is a string)."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import pytest

from apps.gateway.providers.base import Done, ProviderEvent, ProviderRequest, TextDelta, ToolCall
from apps.gateway.providers.mock import MockProvider

FAST = "latency_ms=0&jitter_ms=0&rate_429=0&rate_500=0"
PROMPT = "Your circuit_id is c5. Question: why is the sky blue? (not c9)"
SELF_RESULT = json.dumps(
    {
        "agent_name": "editor",
        "agent_id": "a1",
        "run_id": "r_0123abcd",
        "user_id": "u1",
        "tenant_id": "default",
        "user_tier": "",
        "agent_def_id": "",
    }
)


def fnv1a_32(text: str) -> int:
    """An independent FNV-1a (32-bit) for the score vectors."""
    value = 2166136261
    for byte in text.encode("utf-8"):
        value ^= byte
        value = (value * 16777619) % (1 << 32)
    return value


def expected_score(seed: str) -> float:
    return 0.85 if seed == "" else 0.5 + (fnv1a_32(seed) % 50) / 100


def conversation(prompt: str, results: list[str]) -> list[dict[str, Any]]:
    """The transcript after len(results) tool calls, each answered by one result."""
    msgs: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
    for i, text in enumerate(results):
        call = {"type": "tool_use", "id": f"mock_tu_{i:016x}", "name": "X", "input": {}}
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": "step"}, call]})
        result = {"type": "tool_result", "tool_use_id": f"mock_tu_{i:016x}", "content": text, "is_error": False}
        msgs.append({"role": "user", "content": [result]})
    return msgs


def play(model: str, prompt: str = PROMPT, results: list[str] | None = None) -> list[ProviderEvent]:
    req = ProviderRequest(model=f"{model}?{FAST}", system=["sys"], messages=conversation(prompt, results or []))
    return list(MockProvider("mock").stream(req, threading.Event()))


def step(model: str, results: list[str], prompt: str = PROMPT) -> tuple[str, str, dict[str, Any]]:
    """(narration, tool name, tool input) of the one call the step makes."""
    events = play(model, prompt, results)
    assert len(events) == 3
    text, call, done = events
    assert isinstance(text, TextDelta)
    assert isinstance(call, ToolCall)
    assert re.fullmatch(r"mock_tu_[0-9a-f]{16}", call.id)
    assert isinstance(done, Done) and done.stop_reason == "tool_use"
    return text.text, call.name, call.input


def assert_finished(model: str, results: list[str]) -> None:
    events = play(model, PROMPT, results)
    assert events[0] == TextDelta("done")
    assert len(events) == 2
    assert isinstance(events[1], Done) and events[1].stop_reason == "end_turn"


def subscribe_result(value: Any) -> str:
    """Our Channel subscribe result (apps/channels) with one message."""
    message = {"id": 7, "published_at": "2025-01-01T00:00:00Z", "value": value}
    return json.dumps({"channel": "editing-done/c5", "messages": [message], "next_cursor": 7})


def test_score_vectors_from_an_independent_fnv() -> None:
    assert fnv1a_32("c1") == 2284445657
    assert fnv1a_32("") == 2166136261
    assert expected_score("c1") == 0.5700000000000001
    assert expected_score("c0") == 0.88
    assert expected_score("r_abc123c7") == 0.94  # 4199257744 % 50 == 44
    assert expected_score("mock-editor-c3c3") == 0.64  # 29975014 % 50 == 14
    assert expected_score("c5") == 0.8300000000000001  # bucket 33 keeps its artifact


def test_researcher_script() -> None:
    assert step("mock-researcher", []) == (
        "storing research",
        "Memory",
        {
            "key": "c5-research",
            "op": "set",
            "scope": "user",
            "value": {"text": "Mock research for c5: a brief factual answer."},
        },
    )
    assert step("mock-researcher", ["ok"]) == (
        "publishing done signal",
        "Channel",
        {"channel": "research-done/c5", "op": "publish", "value": {"circuit_id": "c5"}},
    )
    assert_finished("mock-researcher", ["ok", "ok"])
    assert_finished("mock-researcher", ["ok", "ok", "ok"])


def test_editor_script_publishes_the_context_run_id() -> None:
    research = json.dumps({"channel": "research-done/c5", "messages": [], "next_cursor": 0})
    results = [research, '{"value": {"text": "r"}}', '{"ok": true}', SELF_RESULT]
    expected = [
        (
            "subscribing to research-done",
            "Channel",
            {"channel": "research-done/c5", "max_messages": 1, "op": "subscribe", "wait_ms": 120000},
        ),
        ("reading research", "Memory", {"key": "c5-research", "op": "get", "scope": "user"}),
        (
            "storing edited version",
            "Memory",
            {"key": "c5-research-edited", "op": "set", "scope": "user", "value": {"text": "Mock edit c5: tightened."}},
        ),
        ("fetching self identity", "Context", {"op": "self"}),
        (
            "publishing editing-done",
            "Channel",
            {
                "channel": "editing-done/c5",
                "op": "publish",
                "value": {"circuit_id": "c5", "editor_run_id": "r_0123abcd"},
            },
        ),
    ]
    for n, want in enumerate(expected):
        assert step("mock-editor", results[:n]) == want
    assert_finished("mock-editor", [*results, '{"id": 1}'])


def test_editor_falls_back_to_its_own_name_without_a_run_id() -> None:
    results = ["timeout", "not found", "ok", "Context: error"]
    _, _, tool_input = step("mock-editor", results)
    assert tool_input["value"] == {"circuit_id": "c5", "editor_run_id": "mock-editor-c5"}


def test_editor_takes_the_newest_run_id() -> None:
    results = ['{"run_id": "r_old"}', "x", "y", '{"run_id": "r_new"}']
    assert step("mock-editor", results)[2]["value"]["editor_run_id"] == "r_new"
    # an empty run_id does not count: the walk goes on to an older result
    results = ['{"run_id": "r_old"}', "x", "y", '{"run_id": ""}']
    assert step("mock-editor", results)[2]["value"]["editor_run_id"] == "r_old"


@pytest.mark.parametrize(
    "value",
    [
        {"circuit_id": "c5", "editor_run_id": "r_ed1"},
        json.dumps({"circuit_id": "c5", "editor_run_id": "r_ed1"}),
    ],
    ids=["object", "json-string"],
)
def test_evaluator_script_scores_the_editor_run(value: Any) -> None:
    results = [subscribe_result(value), '{"value": {"text": "r"}}', '{"value": {"text": "e"}}', '{"ok": true}']
    score = expected_score("r_ed1c5")
    expected = [
        (
            "subscribing to editing-done",
            "Channel",
            {"channel": "editing-done/c5", "max_messages": 1, "op": "subscribe", "wait_ms": 120000},
        ),
        ("reading research", "Memory", {"key": "c5-research", "op": "get", "scope": "user"}),
        ("reading edited version", "Memory", {"key": "c5-research-edited", "op": "get", "scope": "user"}),
        (
            "storing score",
            "Memory",
            {"key": "c5-research-scored", "op": "set", "scope": "user", "value": {"rationale": "ok", "score": score}},
        ),
        ("submitting evaluation", "Evaluation", {"op": "submit", "rationale": "ok", "run_id": "r_ed1", "score": score}),
    ]
    for n, want in enumerate(expected):
        assert step("mock-evaluator", results[:n]) == want
    assert_finished("mock-evaluator", [*results, '{"ok": true}'])


def test_evaluator_score_vectors() -> None:
    # seed = editor_run_id + circuit_id
    results = [subscribe_result({"editor_run_id": "r_abc123"}), "a", "b", "c"]
    assert step("mock-evaluator", results, "circuit c7")[2]["score"] == 0.94
    results = [subscribe_result({"editor_run_id": "mock-editor-c3"}), "a", "b", "c"]
    assert step("mock-evaluator", results, "circuit c3")[2]["score"] == 0.64


def test_evaluator_finds_editor_run_id_by_regex_in_non_json_text() -> None:
    results = ['received: {"editor_run_id": "r_raw"} (truncated', "a", "b", "c"]
    assert step("mock-evaluator", results)[2]["run_id"] == "r_raw"


def test_evaluator_with_an_empty_subscribe_result_still_submits() -> None:
    empty = json.dumps({"channel": "editing-done/c1", "messages": [], "next_cursor": 0})
    results = [empty, "a", "b", "c"]
    text, tool, tool_input = step("mock-evaluator", results, "Your circuit_id is c1.")
    assert (text, tool) == ("submitting evaluation", "Evaluation")
    # no editor run id: the seed is the circuit id alone, so not 0.85
    assert tool_input == {"op": "submit", "rationale": "ok", "run_id": "", "score": 0.5700000000000001}
    scored = step("mock-evaluator", results[:3], "Your circuit_id is c1.")[2]
    assert scored["value"] == {"rationale": "ok", "score": 0.5700000000000001}


def test_circuit_id_defaults_to_c0() -> None:
    _, _, tool_input = step("mock-evaluator", ["", "", ""], "no circuit here (abc12 and c1x do not count)")
    assert tool_input["key"] == "c0-research-scored"
    assert tool_input["value"]["score"] == 0.88


def test_circuit_id_is_the_first_match_in_user_text_only() -> None:
    msgs = conversation("prefix c12 then c3", [])
    msgs.insert(0, {"role": "assistant", "content": [{"type": "text", "text": "I am c99"}]})
    req = ProviderRequest(model=f"mock-researcher?{FAST}", system=["c77"], messages=msgs)
    call = next(e for e in MockProvider("mock").stream(req, threading.Event()) if isinstance(e, ToolCall))
    assert call.input["key"] == "c12-research"
    # a later user text block is searched when the first has no match
    later = conversation("no id", [])
    later[0]["content"].append({"type": "text", "text": "second block: c4"})
    req = ProviderRequest(model=f"mock-researcher?{FAST}", system=[], messages=later)
    call = next(e for e in MockProvider("mock").stream(req, threading.Event()) if isinstance(e, ToolCall))
    assert call.input["key"] == "c4-research"


def test_mem_search_calls_memory_search_once() -> None:
    text, tool, tool_input = step("mock-mem-search", [])
    assert (text, tool) == ("searching memory", "Memory")
    assert tool_input == {
        "dedup": {"enabled": True, "mode": "drop", "threshold": 0.9},
        "op": "search",
        "query": "research summary",
        "scope": "user",
        "top_k": 10,
    }
    assert_finished("mock-mem-search", ['{"hits": []}'])


def test_usage_on_a_scripted_step_and_at_the_end() -> None:
    events = play("mock-researcher")
    text, call, done = events
    assert isinstance(text, TextDelta) and isinstance(call, ToolCall) and isinstance(done, Done)
    compact = json.dumps(call.input, sort_keys=True, separators=(",", ":"))
    assert done.usage.output_tokens == len("storing research") // 4 + len(compact) // 4
    assert done.usage.input_tokens >= 1
    assert (done.usage.provider, done.usage.model) == ("mock", f"mock-researcher?{FAST}")
    end = play("mock-researcher", PROMPT, ["ok", "ok"])[-1]
    assert isinstance(end, Done)
    assert end.stop_reason == "end_turn"
    assert end.usage.output_tokens == 1  # len("done") // 4
