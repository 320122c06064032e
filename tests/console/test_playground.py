"""The playground in a real browser against the real stack: a chat with a named agent (or an
ad-hoc one, saved as a version of the tenant's agent as POST /v1/_agentdef would) shows
the model's tokens before the turn ends, is steered mid-turn from the page, has a turn
cancelled from the page, shows usage per turn from the ledger, and is continued later from
the conversation list."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import Run, RunStatus
from tests.conftest import wait_status
from tests.console.conftest import Console, bearer, csrf_of, http_sign_in
from tests.factories.live import REPLY, sent_times

pytestmark = pytest.mark.usefixtures("web", "agents", "stack")

ALICE = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
SLOW = {"text": REPLY, "chunk_chars": 4, "chunk_ms": 80}


def test_a_chat_streams_tokens_is_steered_and_has_a_turn_cancelled(
    console: Console, people: dict[str, dict[str, str]]
) -> None:
    script = [SLOW, {"text": "second answer"}, {"text": REPLY, "chunk_chars": 2, "chunk_ms": 250}]
    page = console.sign_in(bearer(people["alice"]))
    page.click("nav >> text=Playground")
    page.fill("#id_agent", "scripted")
    page.fill("#id_message", "MOCK_SCRIPT: " + json.dumps(script))
    page.click("#start-form button")
    page.wait_for_selector("#chat-status:has-text('connected')")
    run = Run.objects.get(id=page.url.rstrip("/").rsplit("/", 1)[-1])
    page.locator("#chat li.assistant", has_text="word05").wait_for(timeout=30_000)
    seen_at = time.time()
    page.fill("#id_message", "steer: keep it short")  # mid-turn: queued for the next turn
    page.click("#steer-form button[type=submit]")
    page.wait_for_selector("#chat-notice:has-text('sent')")
    console.shot(page, "chat-streaming")
    page.locator("#chat li.assistant", has_text="second answer").wait_for(timeout=30_000)
    assert seen_at < sent_times(run.id)[-1], "the chat showed the text only after the mock had sent it all"
    texts = page.locator("#chat li").all_inner_texts()
    assert texts.index("steer: keep it short") < texts.index("second answer")
    assert any(t == REPLY for t in texts)  # live pieces + the committed remainder = the whole turn
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30)
    page.wait_for_selector("#usage-table tr[data-step='1']")  # usage per turn, refreshed as turns end

    page.fill("#id_message", "and a long one")
    page.click("#steer-form button[type=submit]")
    third = page.locator("#chat li.assistant").nth(2)  # the third turn's bubble, while it streams
    third.filter(has_text="word01").wait_for(timeout=30_000)
    page.click("#turn-cancel")
    page.wait_for_selector("#chat-notice:has-text('turn cancelled')")
    page.wait_for_selector("#chat li.event:has-text('turn cancelled')")
    page.wait_for_selector("#chat-status[data-state='awaiting_input']")
    assert wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30).status == RunStatus.AWAITING_INPUT
    assert "word39" not in third.inner_text()  # cut mid-turn: the rest of the reply never came
    console.shot(page, "chat-turn-cancelled")
    phone = console.sign_in(bearer(people["alice"]), phone=True)
    phone.goto(page.url)
    console.shot(phone, "chat-phone")
    services.run_cancel(principal=ALICE, run_id=run.id, reason="test over")


def test_a_conversation_is_continued_from_the_list(console: Console, people: dict[str, dict[str, str]]) -> None:
    page = console.sign_in(bearer(people["alice"]))
    page.goto(console.url("/ui/playground/"))
    page.fill("#id_agent", "scripted")
    page.fill("#id_message", "MOCK_SCRIPT: " + json.dumps([{"text": "first answer"}]))
    page.click("#start-form button")
    page.locator("#chat li.assistant", has_text="first answer").wait_for(timeout=30_000)
    first = Run.objects.get(id=page.url.rstrip("/").rsplit("/", 1)[-1])
    services.run_cancel(principal=ALICE, run_id=first.id, reason="closed for later")
    page.goto(console.url("/ui/playground/"))
    page.click(f"#sessions li[data-session='{first.session_id}'] a")
    page.wait_for_selector("#continue-form")
    page.fill("#continue-form textarea", "MOCK_SCRIPT: " + json.dumps([{"text": "continued answer"}]))
    page.click("#continue-form button")
    page.locator("#chat li.assistant", has_text="continued answer").wait_for(timeout=30_000)
    second = Run.objects.get(id=page.url.rstrip("/").rsplit("/", 1)[-1])
    assert second.session_id == first.session_id and second.id != first.id
    console.shot(page, "chat-continued")


def test_an_ad_hoc_agent_is_a_version_of_the_tenants_agent_and_a_member_is_refused_it(
    console: Console, web: str, people: dict[str, dict[str, str]]
) -> None:
    page = console.sign_in(bearer(people["alice"]))
    page.goto(console.url("/ui/playground/"))
    page.fill("#adhoc_name", "scratch")
    page.fill("#adhoc_provider", "mock")
    page.fill("#adhoc_model", "mock-script")
    page.fill("#adhoc_system_prompt", "Answer in one line.")
    page.fill("#adhoc_message", "MOCK_SCRIPT: " + json.dumps([{"text": "ad hoc answer"}]))
    page.click("#adhoc-form button")
    page.locator("#chat li.assistant", has_text="ad hoc answer").wait_for(timeout=30_000)
    console.shot(page, "chat-ad-hoc")
    run = Run.objects.get(id=page.url.rstrip("/").rsplit("/", 1)[-1])
    assert (run.tenant_id, run.agent_name) == ("acme", "scratch")
    with httpx.Client(base_url=web, timeout=30, headers=people["alice"]) as rest:  # the same version REST sees
        got = rest.post("/v1/_agentdef", json={"op": "get", "def_id": run.agent_def_id}).json()
    assert got["definition"]["system_prompt"] == "Answer in one line." and got["definition"]["model"] == "mock-script"
    services.run_cancel(principal=ALICE, run_id=run.id, reason="test over")

    with httpx.Client(base_url=web, timeout=30) as member:  # runs:create + runs:read: no agent writes, as REST
        http_sign_in(member, bearer(people["bob"]))
        page_html = member.get("/ui/playground/").text
        form = {"name": "scratch", "provider": "mock", "model": "mock-script", "message": "hi"}
        refused = member.post("/ui/playground/adhoc", data={**form, "csrfmiddlewaretoken": csrf_of(page_html)})
    assert refused.status_code == 403 and "insufficient_scope" in refused.text
