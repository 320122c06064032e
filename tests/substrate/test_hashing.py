"""`agent_content_sha256` (SPEC 5.3 recipe) and the Go-compatible `go_json`."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest

from apps.substrate.hashing import agent_content_sha256, go_json

BASE: dict[str, Any] = {
    "provider": "mock",
    "model": "mock-generic",
    "system_prompt": "You are terse.",
    "tools": ["Context"],
    "max_iterations": 8,
}


def h(definition: dict[str, Any], name: str = "echo") -> str:
    return agent_content_sha256(name, definition)


def test_hash_is_sha256_prefix_and_64_lowercase_hex() -> None:
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", h(BASE))


def test_hash_is_sha256_of_go_json_of_sorted_pruned_content() -> None:
    expected = {"max_iterations": 8, "model": "mock-generic", "name": "echo", "provider": "mock"}
    expected |= {"system_prompt": "You are terse.", "tools": ["Context"]}
    compact = json.dumps(expected, separators=(",", ":"), sort_keys=True)
    assert h(BASE) == "sha256:" + hashlib.sha256(compact.encode()).hexdigest()


def test_hash_is_deterministic() -> None:
    assert h(dict(BASE)) == h(dict(BASE))


def test_key_order_is_irrelevant() -> None:
    reordered = dict(reversed(list(BASE.items())))
    assert list(reordered) != list(BASE)
    assert h(reordered) == h(BASE)


def test_nested_key_order_is_irrelevant() -> None:
    a = {**BASE, "sampling": {"temperature": 0.2, "top_p": 0.9}}
    b = {**BASE, "sampling": {"top_p": 0.9, "temperature": 0.2}}
    assert h(a) == h(b)


@pytest.mark.parametrize(
    ("key", "empty"),
    [
        ("description", ""),
        ("tools", []),
        ("sampling", {}),
        ("sampling", {"temperature": None, "stop": []}),
        ("compaction", {"enabled": None, "model": None}),
        ("interruption", {"enabled": False, "kinds": [], "max_pending": 0}),
        ("channels", {"publish": [], "subscribe": None}),
        ("internal", False),
        ("max_tokens", 0),
        ("effort", None),
        ("channels", []),
    ],
)
def test_empty_and_missing_fields_hash_the_same(key: str, empty: Any) -> None:
    without = {k: v for k, v in BASE.items() if k != key}
    assert h({**without, key: empty}) == h(without)


def test_null_and_empty_list_inside_sampling_are_left_out() -> None:
    a = {**BASE, "sampling": {"temperature": 0.5, "top_p": None, "stop": []}}
    b = {**BASE, "sampling": {"temperature": 0.5}}
    assert h(a) == h(b)


# loomcycle's Sampling and Compaction fields are pointers (`*float64`, `*int`,
# `*bool`, `*string`): only an absent or null value is left out, so a zero is
# hashed, and a block holding only zeros is not dropped.
_REST = '"max_iterations":8,"model":"mock-generic","name":"echo","provider":"mock",'
_PROMPT = '"system_prompt":"You are terse.","tools":["Context"]'


@pytest.mark.parametrize(
    ("change", "go_bytes"),
    [
        ({"sampling": {"temperature": 0}}, "{" + _REST + '"sampling":{"temperature":0},' + _PROMPT + "}"),
        ({"sampling": {"seed": 0, "top_p": 0.0}}, "{" + _REST + '"sampling":{"top_p":0,"seed":0},' + _PROMPT + "}"),
        ({"compaction": {"enabled": False}}, '{"compaction":{"enabled":false},' + _REST + _PROMPT + "}"),
        (
            {"compaction": {"model": "", "keep_first": False, "keep_last_n": 0}},
            '{"compaction":{"keep_last_n":0,"keep_first":false,"model":""},' + _REST + _PROMPT + "}",
        ),
        (
            {"compaction": {"memory_flush": False, "target_percentage": 0}},
            '{"compaction":{"target_percentage":0,"memory_flush":false},' + _REST + _PROMPT + "}",
        ),
    ],
)
def test_pointer_fields_keep_zero_values(change: dict[str, Any], go_bytes: str) -> None:
    assert h({**BASE, **change}) == "sha256:" + hashlib.sha256(go_bytes.encode()).hexdigest() != h(BASE)


def test_sampling_temperature_zero_differs_from_unset_and_from_other_values() -> None:
    zero = h({**BASE, "sampling": {"temperature": 0}})
    assert len({zero, h(BASE), h({**BASE, "sampling": {"temperature": 0.1}})}) == 3
    assert h({**BASE, "sampling": {"temperature": 0.0}}) == zero


@pytest.mark.parametrize(
    ("block", "same_as"),
    [
        ({"enabled": False, "max_pending": 0}, None),
        ({"enabled": True, "max_pending": 0, "kinds": []}, {"enabled": True}),
        ({"publish": ["out"], "subscribe": []}, {"publish": ["out"]}),
    ],
)
def test_interruption_and_channels_are_plain_omitempty_values(
    block: dict[str, Any], same_as: dict[str, Any] | None
) -> None:
    key = "channels" if "publish" in block else "interruption"
    expected = h(BASE) if same_as is None else h({**BASE, key: same_as})
    assert h({**BASE, key: block}) == expected


def test_unknown_keys_inside_a_nested_block_are_dropped() -> None:
    assert h({**BASE, "sampling": {"temperature": 0, "mirostat": 2}}) == h({**BASE, "sampling": {"temperature": 0}})


def test_crlf_and_lf_hash_identically() -> None:
    lf = {**BASE, "system_prompt": "line one\nline two\n\nline three"}
    crlf = {**BASE, "system_prompt": "line one\r\nline two\r\n\r\nline three"}
    assert h(crlf) == h(lf)


@pytest.mark.parametrize("suffix", [" ", "\n", "\t \n", "\r\n\r\n", "  \n\n  "])
def test_trailing_whitespace_in_system_prompt_is_not_significant(suffix: str) -> None:
    assert h({**BASE, "system_prompt": "You are terse." + suffix}) == h(BASE)


def test_leading_whitespace_in_system_prompt_is_significant() -> None:
    assert h({**BASE, "system_prompt": "  You are terse."}) != h(BASE)


def test_whitespace_only_system_prompt_hashes_like_missing() -> None:
    without = {k: v for k, v in BASE.items() if k != "system_prompt"}
    assert h({**without, "system_prompt": " \r\n\t"}) == h(without)


def test_trailing_whitespace_in_other_text_fields_is_significant() -> None:
    assert h({**BASE, "description": "d "}) != h({**BASE, "description": "d"})


@pytest.mark.parametrize(
    "extra",
    [{"skills": ["pdf", "xlsx"]}, {"skills": "pdf"}, {"unknown_future_field": 1}],
)
def test_fields_outside_the_hash_set_are_not_significant(extra: dict[str, Any]) -> None:
    assert h({**BASE, **extra}) == h(BASE)


@pytest.mark.parametrize(
    "change",
    [
        {"max_iterations": 9},
        {"model": "mock-tool-loop"},
        {"provider": "mock-stable"},
        {"system_prompt": "You are verbose."},
        {"tools": ["Context", "Other"]},
        {"description": "new"},
        {"tier": "fast"},
        {"sampling": {"temperature": 0.7}},
    ],
)
def test_significant_field_changes_change_the_hash(change: dict[str, Any]) -> None:
    assert h({**BASE, **change}) != h(BASE)


def test_max_iterations_is_significant() -> None:
    assert h({**BASE, "max_iterations": 16}) != h({**BASE, "max_iterations": 17})


def test_name_argument_is_hashed_and_name_in_definition_is_ignored() -> None:
    assert h(BASE, name="a") != h(BASE, name="b")
    assert h({**BASE, "name": "other"}, name="a") == h(BASE, name="a")


def test_integral_float_and_int_hash_the_same() -> None:
    assert h({**BASE, "sampling": {"temperature": 1.0}}) == h({**BASE, "sampling": {"temperature": 1}})


# --- go_json ------------------------------------------------------------------


def test_go_json_escapes_html_characters_like_go() -> None:
    assert go_json("<a href='x'>&</a>") == "\"\\u003ca href='x'\\u003e\\u0026\\u003c/a\\u003e\""


def test_go_json_escapes_line_and_paragraph_separators() -> None:
    assert go_json("a\u2028b\u2029c") == '"a\\u2028b\\u2029c"'


def test_go_json_is_compact_sorted_and_keeps_non_ascii_literal() -> None:
    assert go_json({"b": [1, 2], "a": {"y": "é", "x": None}}) == '{"a":{"x":null,"y":"é"},"b":[1,2]}'


def test_go_json_escaping_round_trips_to_the_original_value() -> None:
    value = {"k<>": "1 < 2 && 3 > 2", "s": "\u2028"}
    assert json.loads(go_json(value)) == value


def test_html_characters_in_system_prompt_are_hashed_escaped() -> None:
    prompt = "Use <b>bold</b> & stay terse."
    content = {"model": "m", "name": "n", "provider": "p", "system_prompt": prompt}
    escaped = (
        json.dumps(content, separators=(",", ":"), sort_keys=True)
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )
    assert agent_content_sha256("n", {"provider": "p", "model": "m", "system_prompt": prompt}) == (
        "sha256:" + hashlib.sha256(escaped.encode()).hexdigest()
    )
