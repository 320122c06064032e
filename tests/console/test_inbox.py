"""The inbox in a real browser against the real stack: a pending Interruption.ask of the
signed-in user is answered from the page and the run goes on with the answer; a run awaiting
input is listed."""

from __future__ import annotations

import json

import pytest

from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import Interrupt, Run, RunStatus
from apps.runs.prompt import Segment
from tests.conftest import wait_for, wait_status
from tests.console.conftest import Console, bearer

pytestmark = pytest.mark.usefixtures("web", "agents", "stack")

ALICE = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
ASK = {"op": "ask", "question": "ship it?", "options": ["yes", "no"]}


def _run(agent: str, steps: list[dict[str, object]], *, interactive: bool = False) -> Run:
    prompt = "MOCK_SCRIPT: " + json.dumps(steps)
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)], interactive=interactive)
    return services.run_create(principal=ALICE, data=data)


def test_an_interrupt_is_answered_from_the_inbox(console: Console, people: dict[str, dict[str, str]]) -> None:
    asked = _run("asker", [{"tools": [{"tool": "Interruption", "input": ASK}]}, {"echo": True}])
    waiting = _run("scripted", [{"text": "your turn"}], interactive=True)
    wait_status(asked.id, RunStatus.AWAITING_INTERRUPT, timeout=30)
    wait_status(waiting.id, RunStatus.AWAITING_INPUT, timeout=30)
    interrupt = wait_for(lambda: Interrupt.objects.filter(run_id=asked.id).first())
    page = console.sign_in(bearer(people["alice"]))
    page.click("nav >> text=Inbox")
    card = page.locator(f"article[data-interrupt='{interrupt.id}']")
    card.wait_for()
    assert "ship it?" in card.inner_text()
    page.wait_for_selector(f"#awaiting li[data-run='{waiting.id}']")
    console.shot(page, "inbox")
    card.locator("button[value=yes]").click()
    page.wait_for_selector(f"#inbox-messages:has-text('{interrupt.id}: answer')")
    assert page.locator(f"article[data-interrupt='{interrupt.id}']").count() == 0
    row = Interrupt.objects.get(id=interrupt.id)
    assert row.status == "resolved" and row.answer == "yes" and row.resolved_by == "console:alice"
    wait_status(asked.id, RunStatus.COMPLETED, timeout=30)
    console.shot(page, "inbox-answered")
    services.run_cancel(principal=ALICE, run_id=waiting.id, reason="test over")
