"""apps.core.redact: each Tier B pattern, Tier A's exact values and its
min-length guard, JSON values kept intact, and the cost on a large message."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest

from apps.core import redact
from apps.core.redact import MIN_SECRET_LEN, Redactor

PATTERNS = Redactor({}, patterns=True)

# (text, the secret that must be gone, what must remain)
TIER_B = [
    ("curl -H 'Authorization: Bearer abc.def-123_XYZ' x", "abc.def-123_XYZ", "Authorization: Bearer [redacted]"),
    ("Authorization: token ghs_0123456789", "ghs_0123456789", "Authorization: token [redacted]"),
    ('{"authorization": "bearer tok123456"}', "tok123456", "bearer [redacted]"),
    ("key sk-proj-AbCdEfGhIjKlMnOp12 used", "sk-proj-AbCdEfGhIjKlMnOp12", "key [redacted:api-key] used"),
    ("aws AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE", "aws [redacted:aws-key] here"),
    ("slack xoxb-123456789012-abcdefABCDEF", "xoxb-123456789012-abcdefABCDEF", "slack [redacted:slack-token]"),
    ("gh ghp_" + "a1B2" * 9 + " end", "ghp_" + "a1B2" * 9, "gh [redacted:github-token] end"),
    ("api_key=s3cr3tvalue&x=1", "s3cr3tvalue", "api_key=[redacted]&x=1"),
    ("password: hunter2hunter2", "hunter2hunter2", "password: [redacted]"),
    ("export OPENAI_API_KEY='zzz-top-value'", "zzz-top-value", "OPENAI_API_KEY='[redacted]"),
    ("access_token=eyJhbGciOi.x.y", "eyJhbGciOi.x.y", "access_token=[redacted]"),
    ("client_secret = 'shh-it-is-secret'", "shh-it-is-secret", "client_secret = '[redacted]"),
]


@pytest.mark.parametrize(("text", "secret", "kept"), TIER_B)
def test_each_pattern_masks_its_secret_and_keeps_the_rest(text: str, secret: str, kept: str) -> None:
    out = PATTERNS.text(text)
    assert secret not in out
    assert kept in out


@pytest.mark.parametrize(
    "text",
    [
        "sk-short1234",  # sk- with fewer than 16 characters after it
        "ghp_tooShort123",
        "AKIA123",
        "max_tokens=4096 and input_tokens: 12",  # token counts are not tokens
        "the commit 0123456789abcdef0123456789abcdef01234567",  # a bare hex string is a SHA, not a PAT
        "plain prose about passwords and tokens",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert PATTERNS.text(text) == text


def test_exact_values_become_their_name_and_the_longest_wins() -> None:
    r = Redactor({"SHORTER": "abcdefgh1", "LONGER": "abcdefgh1-and-more"}, patterns=False)
    assert r.text("x abcdefgh1-and-more y abcdefgh1 z") == "x [redacted:LONGER] y [redacted:SHORTER] z"


def test_min_length_guard_skips_short_values() -> None:
    r = Redactor({"PORT_TOKEN": "5432", "EDGE": "x" * MIN_SECRET_LEN}, patterns=False)
    assert r.text("port 5432 " + "x" * MIN_SECRET_LEN) == "port 5432 [redacted:EDGE]"


def test_with_values_adds_a_runs_credentials() -> None:
    base = Redactor({"ENV_TOKEN": "env-secret-value"}, patterns=False)
    run = base.with_values({"github": "cred-value-1234", "user_bearer": "bearer-value-123456"})
    out = run.text("env-secret-value cred-value-1234 bearer-value-123456")
    assert out == "[redacted:ENV_TOKEN] [redacted:github] [redacted:user_bearer]"
    assert base.text("cred-value-1234") == "cred-value-1234"  # the runtime's redactor is unchanged


@pytest.mark.parametrize("name", ["GITHUB_TOKEN", "DJANGO_SECRET_KEY"])
def test_a_credential_named_like_a_runtime_secret_does_not_unmask_it(name: str) -> None:
    base = Redactor({name: "runtime-secret-value"}, patterns=False)
    run = base.with_values({name: "run-credential-value"})
    assert run.text("runtime-secret-value run-credential-value") == f"[redacted:{name}] [redacted:{name}]"


def test_a_value_shared_by_a_runtime_secret_and_a_credential_is_masked() -> None:
    run = Redactor({"ENV_TOKEN": "one-shared-value"}, patterns=False).with_values({"cred": "one-shared-value"})
    assert "one-shared-value" not in run.text("x one-shared-value y")


@pytest.mark.parametrize(
    "value",
    ["secret-value-1\n", "tab\tand\x01ctl-value", 'quote"back\\slash-val', "caf\u00e9-credential\x7f"],
)
def test_escaped_forms_of_a_value_are_masked_too(value: str) -> None:
    r = Redactor({"C": value}, patterns=False)
    for shown in (
        json.dumps({"v": value}),
        json.dumps({"v": value}, ensure_ascii=False),
        f"Illegal header value {value!r}",
        f"Illegal header value {value.encode()!r}",
        value,
    ):
        out = r.text(shown)
        assert "[redacted:C]" in out, shown
        assert value not in out and value.strip() not in out


def test_json_values_keep_their_structure() -> None:
    r = Redactor({"T": "secret-value-1"}, patterns=True)
    value: dict[str, Any] = {
        "n": 5,
        "ok": True,
        "none": None,
        "list": ["secret-value-1", {"h": 'Authorization: Bearer "quoted'}],
        "password": "hunter2hunter2",  # a key is kept; the bare leaf is not a pattern
        "cmd": 'curl -H "Authorization: Bearer abcdefgh12345"',
    }
    out = r.value(value)
    assert out["n"] == 5 and out["ok"] is True and out["none"] is None
    assert out["list"][0] == "[redacted:T]"
    assert out["cmd"] == 'curl -H "Authorization: Bearer [redacted]"'
    json.loads(json.dumps(out))  # still JSON
    assert value["list"][0] == "secret-value-1"  # the input is not modified


def test_markers_are_inert_to_the_patterns() -> None:
    r = Redactor({"API_TOKEN": "value-of-the-token"}, patterns=True)
    assert r.text("token=value-of-the-token") == "token=[redacted:API_TOKEN]"


def test_runtime_redactor_reads_secret_named_env_and_the_instance_secrets(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOMCYCLE_SOME_SERVICE_TOKEN", "tok-from-env-123")
    monkeypatch.setenv("LOOMCYCLE_SOME_LABEL", "label-not-a-secret")
    redact.runtime_redactor.cache_clear()
    try:
        r = redact.runtime_redactor()
        assert r.text("tok-from-env-123") == "[redacted:LOOMCYCLE_SOME_SERVICE_TOKEN]"
        assert r.text(str(settings.SECRET_KEY)) == "[redacted:DJANGO_SECRET_KEY]"
        assert r.text("label-not-a-secret") == "label-not-a-secret"
        settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, redact_secrets=False)
        redact.runtime_redactor.cache_clear()
        off = redact.run_redactor({"cred": "run-credential-1"})
        assert off.text("tok-from-env-123 sk-abcdefghijklmnopqrstu") == "tok-from-env-123 sk-abcdefghijklmnopqrstu"
        assert off.text("run-credential-1") == "[redacted:cred]"  # a run's credentials: always
    finally:
        redact.runtime_redactor.cache_clear()


@pytest.mark.parametrize(
    ("name", "value", "secret"),
    [
        ("GITHUB_TOKEN", "gh-token-value-1", True),
        ("OPENAI_API_KEY", "openai-key-value", True),
        ("DB_PASSWORD", "db-password-value", True),
        ("SERVICE_APIKEY", "apikey-value-123", True),
        ("APP_CREDENTIALS", "credentials-value", True),
        ("MY_AUTH_TOKEN", "auth-token-value", True),
        ("SSH_AUTH_SOCK", "/tmp/ssh-x/agent.1", False),  # AUTH alone is no marker
        ("XAUTHORITY", "/home/u/.Xauthority", False),
        ("KEYBOARD_LAYOUT", "us-international", False),  # KEY inside a word
        ("MONKEY_NAME", "bonobo-the-great", False),
        ("GOOGLE_APPLICATION_CREDENTIALS", "/etc/gcp/key.json", False),  # a path names where a secret is
        ("SIGNING_KEY_FILE", "./keys/signing.pem", False),
    ],
)
def test_env_secrets_are_matched_by_name_token_and_paths_skipped(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, secret: bool
) -> None:
    monkeypatch.setenv(name, value)
    assert (redact.runtime_secret_values().get(name) == value) is secret


def test_infrastructure_secrets_are_kept_even_when_they_look_like_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    name = sorted(redact.INFRA_SECRET_NAMES)[0]
    monkeypatch.setenv(name, "/a/path/looking/secret")
    assert redact.runtime_secret_values()[name] == "/a/path/looking/secret"


def test_cost_on_a_large_transcript_message(capsys: pytest.CaptureFixture[str]) -> None:
    """Reported in docs/tools.md: a 1 MiB message with no candidate takes the
    fast path; one with candidates throughout runs the patterns. The times are
    printed (pytest -s shows them); the bound is generous, for a loaded CI host."""
    r = Redactor({f"SECRET_{i}_TOKEN": f"value-number-{i:04d}-xyz" for i in range(20)}, patterns=True)
    clean = ("The quick brown fox jumps over the lazy dog. " * 23_000)[: 1 << 20]
    dirty = ("see api_key=abcdef0123 and sk-ABCDEFGHIJKLMNOPQRST here. " * 19_000)[: 1 << 20]
    for label, text in (("clean", clean), ("dirty", dirty)):
        started = time.perf_counter()
        out = r.text(text)
        elapsed = time.perf_counter() - started
        with capsys.disabled():
            print(f"\nredact 1 MiB {label}: {elapsed * 1000:.1f} ms")
        assert elapsed < 10.0, f"{elapsed * 1000:.1f} ms for 1 MiB ({label})"
    assert "sk-ABCD" not in out and "abcdef0123" not in out
