"""Secrets never reach the database (issue 20): a real run on a real worker,
whose prompt, tool inputs, tool results and final text carry every kind of
secret, and a gateway call; then a full `pg_dump` of the test database holds
none of the values, while the run's SSE stream did show the model's text."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from django.conf import settings

from apps.gateway.models import GatewayCall
from apps.runs.models import Run, RunEvent, RunStatus, ToolCallRecord
from tests.conftest import unicode_escaped, wait_for, wait_status
from tests.factories.runs import (
    _pg_dump,
    sse_frames,
)

pytestmark = pytest.mark.usefixtures("agents", "stack")

CREDENTIAL = "cred-gh-9f8e7d6c5b4a"
BEARER = "bearer.Tok-1234567890abcdef"
# (the text a tool input or the prompt carries, the secret value in it that must vanish)
PATTERNED = [
    ("Authorization: Bearer hdr-tok-5a4b3c2d1e", "hdr-tok-5a4b3c2d1e"),
    ("sk-proj-QWERTYUIOPasdfghjk12", "sk-proj-QWERTYUIOPasdfghjk12"),
    ("AKIAQWERTYUIOPASDFGH", "AKIAQWERTYUIOPASDFGH"),
    ("xoxb-1111222233-abcdefABCDEF", "xoxb-1111222233-abcdefABCDEF"),
    ("ghp_" + "Zx9" * 12, "ghp_" + "Zx9" * 12),
    ("password=hunter2-horse-battery", "hunter2-horse-battery"),
]


def _secrets() -> list[tuple[str, str]]:
    """Every (carrier text, secret value): the runtime's own env secret, the run's two credentials, the patterns."""
    env_secret = str(settings.SECRET_KEY)  # DJANGO_SECRET_KEY: one key for the suite's processes
    return [(env_secret, env_secret), (CREDENTIAL, CREDENTIAL), (BEARER, BEARER), *PATTERNED]


def _unicode_escaped(text: str) -> str:
    """`text` as a JSON string literal of escapes only (tests.conftest.unicode_escaped)."""
    return f'"{unicode_escaped(text)}"'


def _prompt() -> str:
    """Each secret in clear in the prompt, and a script whose tool inputs (and so
    the tools' is_error results, which quote an unknown op) and final text carry them."""
    carriers = [c for c, _ in _secrets()]
    calls = ", ".join(f'{{"tool": "Context", "input": {{"op": {_unicode_escaped(c)}}}}}' for c in carriers)
    final = _unicode_escaped("All checked; the last key was " + PATTERNED[1][0])
    script = f'[{{"tools": [{calls}]}}, {{"text": {final}}}]'
    return "Please check these: " + " | ".join(carriers) + f"\nMOCK_SCRIPT: {script}"


def _run_through_sse(http: httpx.Client) -> tuple[str, list[dict[str, Any]]]:
    body = {
        "agent": "scripted",
        "prompt": _prompt(),
        "user_bearer": BEARER,
        "user_credentials": {"github": CREDENTIAL},
    }
    with http.stream("POST", "/v1/runs", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        frames = sse_frames(resp.iter_lines())
    run_id = frames[1]["data"]["run_id"]
    return run_id, frames


def test_no_secret_reaches_the_database_while_the_stream_shows_the_models_text(
    http: httpx.Client, stack_env: dict[str, str]
) -> None:
    run_id, frames = _run_through_sse(http)
    run = wait_status(run_id, RunStatus.COMPLETED, timeout=30)

    # The run did what the script says: one tool call per secret, each refused quoting its input.
    calls = RunEvent.objects.filter(run_id=run_id, type="tool_result").order_by("seq")
    assert calls.count() == len(_secrets())
    assert all(e.payload["is_error"] and "unknown op" in e.payload["text"] for e in calls)
    assert ToolCallRecord.objects.filter(run_id=run_id).count() == len(_secrets())
    texts = [f["data"]["text"] for f in frames if f.get("event") == "text"]
    # the stream showed the model's text (live pieces and the committed rest, apps.runs.livemerge)
    assert "".join(texts) == "All checked; the last key was [redacted:api-key]"
    # Markers name what was masked.
    stored = json.dumps([e.payload for e in RunEvent.objects.filter(run_id=run_id)])
    for marker in ("[redacted:DJANGO_SECRET_KEY]", "[redacted:github]", "[redacted:user_bearer]"):
        assert marker in stored
    assert "Authorization: Bearer [redacted]" in stored and "password=[redacted]" in stored
    assert run.credentials_sealed == ""  # the terminal commit cleared them

    # A gateway call whose caller-supplied user id is a key.
    gw = http.post(
        "/v1/chat/completions",
        json={
            "loomcycle_provider": "mock",
            "model": "mock-generic",
            "messages": [{"role": "user", "content": "hi"}],
            "user": PATTERNED[1][1],
        },
    )
    assert gw.status_code == 200, gw.text
    row = wait_for(lambda: GatewayCall.objects.filter(request_id=gw.headers["x-request-id"]).first())
    assert row.user_id == "[redacted:api-key]"

    dump = _pg_dump(stack_env["DATABASE_URL"])
    assert Run.objects.filter(id=run_id).exists() and run_id in dump
    leaked = [secret for _, secret in _secrets() if secret in dump]
    assert leaked == []
