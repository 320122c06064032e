"""The console's run pages in a real browser against the real stack: a run's timeline with its
tool calls, the live tail growing a turn's text before the model has finished it, cancel, fork
from step N and the comparison with its source, and a run's children as a tree."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import Run, RunStatus
from apps.runs.prompt import Segment
from tests.conftest import wait_for, wait_status
from tests.console.conftest import Console, bearer
from tests.factories.live import REPLY, sent_times

pytestmark = pytest.mark.usefixtures("web", "agents", "stack")

ALICE = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))


def scripted(steps: list[dict[str, Any]], agent: str = "scripted", **kw: Any) -> Run:
    prompt = f"Console test. MOCK_SCRIPT: {json.dumps(steps)}"
    return services.run_create(
        principal=ALICE, data=services.RunCreate(agent=agent, segments=[Segment(text=prompt)], **kw)
    )


def test_a_run_page_shows_the_timeline_with_tool_calls_and_children(
    console: Console, people: dict[str, dict[str, str]]
) -> None:
    run = scripted([{"tool": "Context", "input": {"op": "time"}}, {"text": "the time is known"}])
    parent = services.run_create(
        principal=ALICE, data=services.RunCreate(agent="spawner", segments=[Segment(text="go")])
    )
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    wait_status(parent.id, RunStatus.COMPLETED, timeout=60)
    page = console.sign_in(bearer(people["alice"]))
    page.click(f"a[href='/ui/runs/{run.id}/']")
    page.wait_for_selector("#timeline")
    titles = page.locator("#timeline .title").all_inner_texts()
    assert any("tool call Context" in t for t in titles) and any("tool result Context" in t for t in titles)
    assert '"op": "time"' in page.inner_text("#timeline li.tool_call pre.detail")
    assert page.inner_text("#run-status") == "completed"
    assert page.locator("#live").count() == 0  # finished: no live tail
    console.shot(page, "run")
    page.goto(console.url(f"/ui/runs/{parent.id}/"))
    child = Run.objects.get(parent_id=parent.id)
    page.wait_for_selector(f"#children li[data-child='{child.id}']")
    console.shot(page, "run-children")


def test_the_live_tail_shows_a_turns_text_before_the_model_has_finished_it(
    console: Console, people: dict[str, dict[str, str]]
) -> None:
    live_turn = {"text": REPLY, "chunk_chars": 4, "chunk_ms": 60}
    run = scripted([{"text": "first turn"}, live_turn], interactive=True)
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=30)
    page = console.sign_in(bearer(people["alice"]))
    page.goto(console.url(f"/ui/runs/{run.id}/"))
    page.wait_for_selector("#tail-status:has-text('connected')")
    services.run_input(principal=ALICE, run_id=run.id, text="go on")
    page.locator("#timeline li.assistant", has_text="word05").last.wait_for(timeout=30_000)
    seen_at = time.time()
    console.shot(page, "live-tail")
    wait_status(run.id, RunStatus.AWAITING_INPUT, timeout=60)
    assert seen_at < sent_times(run.id)[-1], "the tail showed the text only after the mock had sent it all"
    page.wait_for_function(
        "t => [...document.querySelectorAll('#timeline li.assistant .text')].some(p => p.textContent === t)",
        arg=REPLY,
    )  # live pieces + the committed remainder = the whole turn
    assert page.locator("#timeline li.user", has_text="go on").count() == 1
    page.click("#cancel-form button")
    page.wait_for_selector("#run-status:has-text('cancelled')")
    assert Run.objects.get(id=run.id).status == RunStatus.CANCELLED


def test_a_fork_from_step_n_opens_beside_its_source(console: Console, people: dict[str, dict[str, str]]) -> None:
    run = scripted([{"tool": "Context", "input": {"op": "time"}}, {"text": "source answer"}])
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    page = console.sign_in(bearer(people["alice"]))
    page.goto(console.url(f"/ui/runs/{run.id}/"))
    page.fill("#id_from_step", "0")
    page.fill("#id_prompt", "MOCK_SCRIPT: " + json.dumps([{"text": "fork answer"}]))
    page.click("#fork-form button")
    page.wait_for_selector("#forked-from")
    fork = Run.objects.get(forked_from_run_id=run.id)
    assert page.inner_text("#run-id") == fork.id
    wait_status(fork.id, RunStatus.COMPLETED, timeout=30)
    page.click("#compare-source")
    page.wait_for_selector("#compare-note")
    assert "through step 0" in page.inner_text("#compare-note")
    left_diverged = page.locator("#left li.diverged").all_inner_texts()
    right_diverged = page.locator("#right li.diverged").all_inner_texts()
    assert any("source answer" in t for t in left_diverged)
    assert any("fork answer" in t for t in right_diverged)
    assert not any("source answer" in t for t in right_diverged)
    console.shot(page, "compare")
    phone = console.sign_in(bearer(people["alice"]), phone=True)
    phone.goto(page.url)
    console.shot(phone, "compare-phone")
    wait_for(lambda: phone.evaluate("document.documentElement.scrollWidth") <= 390)
