"""Known content-hash vectors (SPEC 5.3, appendix E).

Each vector is the exact Go `encoding/json` output for a fixed definition,
written out by hand from the recipe (alphabetical top-level keys, empty values
omitted, text normalised, `<>&` escaped, Go float text, nested structs in
their Go declaration order), and its SHA-256 computed once and pinned. Each
test checks both halves: the hand-written bytes hash to the pinned hex, and
our hasher, given messy input, produces that hash.

The `test_loomcycle_*` vectors are loomcycle's own pins, copied from its Go
tests (each names its file), so they prove agreement with the Go
implementation itself. loomcycle pins no skill vector.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from apps.substrate.hashing import (
    agent_content_sha256,
    go_float,
    go_json,
    mcp_content_sha256,
    skill_content_sha256,
)


def pinned(go_bytes: str, hex_digest: str) -> str:
    assert hashlib.sha256(go_bytes.encode()).hexdigest() == hex_digest, "the hand-written vector drifted"
    return "sha256:" + hex_digest


# --- agent ---------------------------------------------------------------------

AGENT = pinned(
    '{"max_iterations":8,"model":"claude-sonnet-4-5","name":"researcher","provider":"anthropic",'
    '"system_prompt":"Be thorough.","tools":["WebFetch","Read"]}',
    "c89be97500d01e47ca2e67146287160c9a0b354c4c5dcaaf9980ececee8bcdd2",
)
AGENT_DEF: dict[str, Any] = {
    "tools": ["WebFetch", "Read"],
    "system_prompt": "Be thorough.",
    "provider": "anthropic",
    "model": "claude-sonnet-4-5",
    "max_iterations": 8,
}


def test_agent_vector() -> None:
    assert agent_content_sha256("researcher", AGENT_DEF) == AGENT


@pytest.mark.parametrize(
    "empties",
    [
        {"description": "", "effort": None, "memory_scopes": [], "max_tokens": 0, "internal": False},
        {"channels": {"publish": [], "subscribe": []}, "interruption": {"enabled": False, "kinds": []}},
        {"models": {}, "providers": [], "sampling": {}, "compaction": {"enabled": None}},
    ],
)
def test_empty_and_missing_fields_hash_the_same(empties: dict[str, Any]) -> None:
    assert agent_content_sha256("researcher", {**AGENT_DEF, **empties}) == AGENT


@pytest.mark.parametrize(
    "prompt",
    ["Be thorough.\r\n", "Be thorough.\n\n", "Be thorough. \t ", "Be thorough.\r\n\r\n  \t"],
)
def test_crlf_and_trailing_whitespace_hash_like_the_clean_prompt(prompt: str) -> None:
    assert agent_content_sha256("researcher", {**AGENT_DEF, "system_prompt": prompt}) == AGENT


def test_crlf_inside_the_prompt_hashes_like_lf() -> None:
    lf = agent_content_sha256("researcher", {**AGENT_DEF, "system_prompt": "a\nb"})
    assert agent_content_sha256("researcher", {**AGENT_DEF, "system_prompt": "a\r\nb"}) == lf


@pytest.mark.parametrize(
    "ignored",
    [
        {"skills": ["pdf", "xlsx"]},
        {"agent_def_scopes": ["self"], "skill_def_scopes": ["any"], "schedule_def_scopes": ["any"]},
        {"interactive": True, "disable_context": True, "volumes": ["workspace"], "retry_attempts": 2},
    ],
)
def test_fields_outside_the_content_set_are_not_significant(ignored: dict[str, Any]) -> None:
    assert agent_content_sha256("researcher", {**AGENT_DEF, **ignored}) == AGENT


def test_max_iterations_is_significant() -> None:
    nine = pinned(
        '{"max_iterations":9,"model":"claude-sonnet-4-5","name":"researcher","provider":"anthropic",'
        '"system_prompt":"Be thorough.","tools":["WebFetch","Read"]}',
        "980bffa0c29c1f2ec3d435b164183c62fbeff173d065e3d42326016b41a8efe5",
    )
    assert agent_content_sha256("researcher", {**AGENT_DEF, "max_iterations": 9}) == nine != AGENT


def test_tool_order_is_significant() -> None:
    assert agent_content_sha256("researcher", {**AGENT_DEF, "tools": ["Read", "WebFetch"]}) != AGENT


def test_html_characters_are_escaped_as_go_does() -> None:
    expected = pinned(
        '{"model":"mock-generic","name":"html","provider":"mock",'
        '"system_prompt":"Answer in \\u003cb\\u003ebold\\u003c/b\\u003e \\u0026 be brief."}',
        "97aa46e7695052f3c9372263798df3d38d7094103c2ebb67dd86c9ac2fd6f9ed",
    )
    definition = {"provider": "mock", "model": "mock-generic", "system_prompt": "Answer in <b>bold</b> & be brief."}
    assert agent_content_sha256("html", definition) == expected


def test_non_ascii_is_literal_and_line_separator_escaped() -> None:
    expected = pinned(
        '{"description":"café \\u2028 naïve","model":"m","name":"u","provider":"p"}',
        "93e30223d9b37331f9e7a44d973c3ae711506481f38c343f892579d4b8b51a59",
    )
    assert agent_content_sha256("u", {"provider": "p", "model": "m", "description": "café \u2028 naïve"}) == expected


def test_floats_and_sampling_struct_order_follow_go() -> None:
    # Go's float text: 1e-06 is positional ("0.000001"), below that exponent
    # form with a short exponent ("1e-7"); 1.5 stays 1.5. Sampling fields come
    # in the Go struct's declaration order, not alphabetically.
    expected = pinned(
        '{"model":"m","name":"sampler","provider":"p","sampling":{"temperature":0.000001,"top_p":0.95,'
        '"top_k":40,"frequency_penalty":1e-7,"presence_penalty":1.5,"seed":42,"stop":["END"]}}',
        "05e2f7c42a9b6501d1540c9b80ebf773c6ac8edb48ef1d87b22b9a6f68dbfc3e",
    )
    sampling = {
        "stop": ["END"],
        "seed": 42,
        "presence_penalty": 1.5,
        "frequency_penalty": 1e-7,
        "top_k": 40,
        "top_p": 0.95,
        "temperature": 1e-6,
    }
    assert agent_content_sha256("sampler", {"provider": "p", "model": "m", "sampling": sampling}) == expected


def test_loomcycle_pinned_agent_vector() -> None:
    # loomcycle internal/agents/sign_test.go TestSign_KnownVector (the form after
    # its allowed_tools -> tools rename): AgentContent{Name: "researcher",
    # SystemPrompt: "be thorough", Tools: [WebFetch, Read], MaxTokens: 8192}.
    definition = {"tools": ["WebFetch", "Read"], "max_tokens": 8192, "system_prompt": "be thorough"}
    expected = pinned(
        '{"max_tokens":8192,"name":"researcher","system_prompt":"be thorough","tools":["WebFetch","Read"]}',
        "e03953f0f2b43b6e9521b0c5e3f31cdddad6c3d3e907deb8172cd4c959de105e",
    )
    assert agent_content_sha256("researcher", definition) == expected


def test_loomcycle_pre_rename_agent_vector_differs_only_in_the_tool_key() -> None:
    # loomcycle internal/agents/sign_test.go TestSign_KnownVector before the
    # allowed_tools -> tools rename pinned 9c6a6098...: the same content with the
    # tool list under `allowed_tools` (which then sorted first). Current loomcycle
    # and this build hash it under `tools`; an old row's hash is not reproduced.
    old = pinned(
        '{"allowed_tools":["WebFetch","Read"],"max_tokens":8192,"name":"researcher","system_prompt":"be thorough"}',
        "9c6a6098efbad0bdde2cd0c777a70d97b204125c37004b3f80a7f5734cde2c03",
    )
    definition = {"tools": ["WebFetch", "Read"], "max_tokens": 8192, "system_prompt": "be thorough"}
    assert agent_content_sha256("researcher", definition) != old


def test_loomcycle_pinned_authorship_vector() -> None:
    # loomcycle internal/agents/sign_operator_authored_test.go
    # TestSign_AuthorshipIsNotContent: AgentContent{Name: "reviewer",
    # SystemPrompt: "You review.", Tier: "middle"}.
    expected = pinned(
        '{"name":"reviewer","system_prompt":"You review.","tier":"middle"}',
        "0d5ea67cfbfa7a386e9b8eedcd3739a7cc779b8f62f5be9121787a55d076519d",
    )
    assert agent_content_sha256("reviewer", {"tier": "middle", "system_prompt": "You review.\n"}) == expected


def test_loomcycle_pinned_vector_with_models() -> None:
    # loomcycle internal/agents/sign_test.go TestSign_KnownVectorWithModels: the
    # candidate struct emits provider before model.
    models = {
        "low": [{"model": "deepseek-chat", "provider": "deepseek"}],
        "high": [
            {"model": "claude-opus-4-5", "provider": "anthropic"},
            {"provider": "openai", "model": "gpt-5-2025-08-07"},
        ],
    }
    expected = pinned(
        '{"models":{"high":[{"provider":"anthropic","model":"claude-opus-4-5"},'
        '{"provider":"openai","model":"gpt-5-2025-08-07"}],'
        '"low":[{"provider":"deepseek","model":"deepseek-chat"}]},"name":"researcher"}',
        "c23827d24ac610aa96718ea32a8e3c22783c3beb1ad3cc0830165ba82f9fc701",
    )
    assert agent_content_sha256("researcher", {"models": models}) == expected


def test_pointer_fields_keep_zeros_and_plain_fields_drop_them() -> None:
    # Sampling/Compaction fields are Go pointers: 0, false and "" are written.
    # max_pending/max_tokens are plain omitempty ints: 0 is left out, and an
    # interruption block of zeros is dropped whole.
    expected = pinned(
        '{"compaction":{"enabled":false,"keep_last_n":0,"model":""},"model":"m","name":"zero","provider":"p",'
        '"sampling":{"temperature":0,"top_k":0,"seed":0}}',
        "9fafaf90fcf26ab7838aec62c239ef854e0e493f01cabcea10d7f66b2b284034",
    )
    definition = {
        "provider": "p",
        "model": "m",
        "max_tokens": 0,
        "sampling": {"seed": 0, "top_k": 0, "temperature": 0.0, "top_p": None, "stop": []},
        "compaction": {"model": "", "keep_last_n": 0, "enabled": False, "keep_first": None},
        "interruption": {"enabled": False, "kinds": [], "max_pending": 0},
    }
    assert agent_content_sha256("zero", definition) == expected


def test_struct_order_of_core_blocks_and_search_providers_before_sampling() -> None:
    # AgentContent declares SearchProviders before Sampling (the one place its
    # order is not alphabetical); CoreBlock is label, scope, limit_bytes,
    # read_only, and label has no omitempty.
    expected = pinned(
        '{"core_blocks":[{"label":"user","scope":"user","limit_bytes":2048,"read_only":true},{"label":""}],'
        '"model":"m","name":"order","provider":"p","search_providers":["brave"],"sampling":{"top_p":0.5}}',
        "a93715aaab5ed217e03e3aa5fee1326da8400c2cf278d980a1d51c517c949576",
    )
    definition = {
        "provider": "p",
        "model": "m",
        "sampling": {"top_p": 0.5},
        "search_providers": ["brave"],
        "core_blocks": [
            {"read_only": True, "limit_bytes": 2048, "scope": "user", "label": "user"},
            {"read_only": False, "limit_bytes": 0, "scope": ""},
        ],
    }
    assert agent_content_sha256("order", definition) == expected


def test_models_map_keeps_empty_tiers_and_candidate_fields() -> None:
    # A map keeps every entry (Go writes `[]` and `null`); TierCandidate's
    # provider/model have no omitempty.
    expected = pinned(
        '{"models":{"empty":[],"low":[{"provider":"","model":"m1"}],"none":null},"name":"tiers"}',
        "3a0d84fee84c0192acc3805b44d67aeaf9061107ec1cd6ff69c48442daec18c1",
    )
    models = {"low": [{"model": "m1", "weight": 3}], "none": None, "empty": []}
    assert agent_content_sha256("tiers", {"models": models}) == expected


def test_channels_and_interruption_drop_empty_fields() -> None:
    expected = pinned(
        '{"channels":{"publish":["out"]},"interruption":{"enabled":true},"model":"m","name":"acl","provider":"p"}',
        "673427fa4db17c3b56565c6c9e59fe4cb14f20e77600333645c7c7b907b34ab8",
    )
    definition = {
        "provider": "p",
        "model": "m",
        "channels": {"subscribe": [], "publish": ["out"]},
        "interruption": {"max_pending": 0, "kinds": None, "enabled": True},
    }
    assert agent_content_sha256("acl", definition) == expected


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.1, "0.1"),
        (1.5, "1.5"),
        (1e-6, "0.000001"),
        (1.5e-5, "0.000015"),
        (1e-7, "1e-7"),
        (1.234e-10, "1.234e-10"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (-2.5e-8, "-2.5e-8"),
        (2.0, "2"),
    ],
)
def test_go_float_text(value: float, text: str) -> None:
    assert go_float(value) == text
    assert go_json([value]) == f"[{text}]"


def test_go_json_refuses_nan() -> None:
    with pytest.raises(ValueError, match="unsupported value"):
        go_json(float("nan"))


# --- skill ---------------------------------------------------------------------
# SkillContent hashes the tool list as `tools` since loomcycle's allowed_tools ->
# tools rename (internal/skills/sign_test.go round-trips an overlay's "tools");
# before it, loomcycle's skills/sign.go wrote `allowed_tools`.

SKILL = pinned(
    '{"body":"Summarise concisely.\\n\\nKeep names.","description":"Shorten things","name":"summariser",'
    '"tools":["Read"]}',
    "bebddcf391aa335959cbf68eaab755c165b04d000e0fd4a319a6da1e5f5406ce",
)


@pytest.mark.parametrize(
    "body",
    [
        "Summarise concisely.\n\nKeep names.",
        "Summarise concisely.\r\n\r\nKeep names.\r\n",
        "Summarise concisely.\n\nKeep names. \n\t",
    ],
)
def test_skill_vector_with_normalised_body(body: str) -> None:
    definition = {"body": body, "description": "Shorten things", "tools": ["Read"]}
    assert skill_content_sha256("summariser", definition) == SKILL


def test_skill_description_is_not_normalised_and_paragraphs_are_kept() -> None:
    base = {"body": "Summarise concisely.\n\nKeep names.", "description": "Shorten things", "tools": ["Read"]}
    assert skill_content_sha256("summariser", {**base, "description": "Shorten things "}) != SKILL
    assert skill_content_sha256("summariser", {**base, "body": "Summarise concisely.\nKeep names."}) != SKILL


# --- MCP server ----------------------------------------------------------------

MCP = pinned(
    '{"description":"Issue tracker","headers":{"Authorization":"Bearer ${run.user_bearer}","X-Team":"core"},'
    '"name":"tracker","transport":"http","url":"https://mcp.example.com/v1?a=1\\u0026b=2"}',
    "5ad3a9270b7495117ebd264d2880fd09926a9a232cd73d1c5d29411b22e70cf4",
)


def test_mcp_vector_normalises_description_and_ignores_discovered_tools() -> None:
    definition = {
        "url": "https://mcp.example.com/v1?a=1&b=2",
        "transport": "http",
        "headers": {"X-Team": "core", "Authorization": "Bearer ${run.user_bearer}"},
        "description": "Issue tracker \r\n\r\n",
        "discovered_tools": [{"name": "create_issue"}],
        "tools": ["create_issue"],
    }
    assert mcp_content_sha256("tracker", definition) == MCP
    assert mcp_content_sha256("tracker", {**definition, "discovered_tools": []}) == MCP


def test_mcp_header_with_an_empty_value_is_kept() -> None:
    # headers is a Go map: its entries are written even when the value is "".
    expected = pinned(
        '{"headers":{"X-Empty":""},"name":"h","transport":"http","url":"https://x.example/mcp"}',
        "841e23ce7847e9801956a77a7780b0f331650b7b55b517f4c66eeea8698b2fcf",
    )
    definition = {"transport": "http", "url": "https://x.example/mcp", "headers": {"X-Empty": ""}}
    assert mcp_content_sha256("h", definition) == expected


def test_mcp_empty_headers_hash_like_none() -> None:
    bare = {"transport": "http", "url": "https://x.example/mcp"}
    assert mcp_content_sha256("x", {**bare, "headers": {}}) == mcp_content_sha256("x", bare)


def test_loomcycle_pinned_mcp_vector() -> None:
    # loomcycle internal/mcp/sign_test.go TestSign_KnownVector.
    definition = {
        "transport": "streamable-http",
        "url": "https://n8n.example.com/mcp/abc",
        "headers": {"Authorization": "Bearer ${LOOMCYCLE_N8N_TOKEN}"},
        "description": "n8n workflow exposing Mailgun send via MCP Server Trigger",
    }
    expected = "sha256:7da12c1e79db6d6e5e5dd323f121a1be1606ef454b3a9dc91b101880ac663e2a"
    assert mcp_content_sha256("n8n-mailgun", definition) == expected
