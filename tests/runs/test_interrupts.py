"""Interruption (SPEC 6.7, issue 22): `ask` parks the run with no worker held, a
resolve (REST or the Django admin) or beat's expiry answers it exactly once, and
every route is tenant-scoped. Real workers, beat and a web process; the agents
play mock-script (tests/loomcycle.test.yaml: asker, asker-one, asker-off)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from mcp.client import Client as McpClient

from apps.channels.models import ChannelMessage
from apps.core.errors import Gone
from apps.core.types import Principal
from apps.runs import engine, services
from apps.runs.interrupts import services as interrupts
from apps.runs.models import Interrupt, InterruptStatus, Run, RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.runs.tasks import interrupts_expire_task
from tests.conftest import ALICE, wait_for, wait_status
from tests.factories.mcp import call as mcp_call
from tests.factories.mcp import over_http
from tests.factories.runs import ASK, ask_run
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")


def events(run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.payload for e in RunEvent.objects.filter(run_id=run_id, type=kind).order_by("seq")]


def parked(run: Run) -> Interrupt:
    """Wait for the run to park on its ask; its one interrupt row."""
    wait_status(run.id, RunStatus.AWAITING_INTERRUPT, timeout=30)
    return Interrupt.objects.get(run_id=run.id)


def ask_result(run_id: str) -> dict[str, Any]:
    (result,) = [r for r in events(run_id, "tool_result") if r["tool_use"]["name"] == "Interruption"]
    return {"is_error": result["is_error"], **json.loads(result["text"])}


def resolve(http: httpx.Client, row: Interrupt, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
    url = f"/v1/runs/{row.run_id}/interrupts/{row.id}/resolve"
    return http.post(url, json=body, headers=headers or {})


def test_an_ask_parks_without_a_lease_and_the_answer_completes_the_run(stack: WorkerPool, http: httpx.Client) -> None:
    run = ask_run()
    row = parked(run)
    held = Run.objects.get(id=run.id)
    assert (held.lease_owner, held.lease_until, held.pending_calls) == ("", None, 1)  # no worker holds it
    (pending,) = events(run.id, "interruption_pending")
    assert pending["interruption"]["interrupt_id"] == row.id
    assert pending["interruption"]["options"] == ["yes", "no"] and pending["interruption"]["priority"] == "high"
    bridged = wait_for(lambda: ChannelMessage.objects.filter(channel="_system/interrupts/pending").first())
    assert bridged.payload["interrupt_id"] == row.id and bridged.payload["run_id"] == run.id
    assert http.get(f"/v1/runs/{run.id}").json()["awaited_state"] == "interrupted"
    listed = http.get(f"/v1/runs/{run.id}/interrupts").json()["interrupts"]
    assert [(i["interrupt_id"], i["status"], i["question"]) for i in listed] == [(row.id, "pending", ASK["question"])]
    inbox = http.get("/v1/users/u1/interrupts").json()["interrupts"]
    assert [i["interrupt_id"] for i in inbox] == [row.id]

    resp = resolve(http, row, answer="yes", resolved_by="ops-console")
    assert resp.status_code == 200, resp.text
    assert resp.json()["interrupt_id"] == row.id and resp.json()["status"] == "resolved"

    done = wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    assert done.stop_reason == "end_turn"
    result = ask_result(run.id)
    assert (result["is_error"], result["answer"], result["resolved_by"]) == (False, "yes", "ops-console")
    assert result["resolved_at"] == resp.json()["resolved_at"]  # what the agent was told is what was stored
    assert http.get("/v1/users/u1/interrupts").json()["interrupts"] == []  # the inbox shows pending ones
    resolved = wait_for(lambda: ChannelMessage.objects.filter(channel="_system/interrupts/resolved").first())
    assert resolved.scope_id == "u1"  # declared scope: user, so the run's user's stream
    assert (resolved.payload["interrupt_id"], resolved.payload["status"]) == (row.id, "resolved")
    assert http.get("/v1/users/u1/interrupts", params={"status": "resolved"}).json()["interrupts"][0]["answer"] == "yes"


def test_replies_that_do_not_fit_are_422_and_a_decline_is_the_tool_result(
    stack: WorkerPool, http: httpx.Client
) -> None:
    run = ask_run()
    row = parked(run)
    for body, code in (
        ({"answer": "maybe"}, "answer_not_in_options"),
        ({"answer": "yes", "disposition": "declined"}, "decline_with_answer"),
        ({"answer": "yes", "disposition": "later"}, "invalid_disposition"),
        ({"answer": "yes", "kind": "approval"}, "invalid_kind"),
        ({}, "answer_required"),
        ({"answer": "yes", "resolved_by": "admin:root"}, "reserved_resolver"),
        ({"answer": "yes", "resolved_by": "_system"}, "reserved_resolver"),
    ):
        resp = resolve(http, row, **body)
        assert (resp.status_code, resp.json()["code"]) == (422, code), body
    assert Interrupt.objects.get(id=row.id).status == InterruptStatus.PENDING  # nothing was written

    resp = resolve(http, row, disposition="declined", note="not on a Friday")
    assert (resp.status_code, resp.json()["status"]) == (200, "declined")
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    result = ask_result(run.id)
    assert (result["is_error"], result["declined"], result["note"]) == (False, True, "not on a Friday")
    again = resolve(http, row, answer="yes")
    assert (again.status_code, again.json()["code"]) == (409, "interrupt_not_pending")


def test_two_racing_resolves_give_one_200_and_one_409(stack: WorkerPool, http: httpx.Client) -> None:
    run = ask_run()
    row = parked(run)
    start = threading.Barrier(2)
    codes: list[int] = []

    def answer(value: str) -> None:
        start.wait(timeout=10)
        codes.append(resolve(http, row, answer=value).status_code)

    racers = [threading.Thread(target=answer, args=(v,)) for v in ("yes", "no")]
    for t in racers:
        t.start()
    for t in racers:
        t.join(timeout=30)
    assert sorted(codes) == [200, 409]
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    assert len([r for r in events(run.id, "tool_result") if r["tool_use"]["name"] == "Interruption"]) == 1
    assert Interrupt.objects.get(id=row.id).answer == ask_result(run.id)["answer"]  # the winner's


def test_an_expired_ask_times_out_once_and_a_late_resolve_is_410(stack: WorkerPool, http: httpx.Client) -> None:
    run = ask_run()
    row = parked(run)
    Interrupt.objects.filter(id=row.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    interrupts_expire_task()  # what beat runs (beat may have run it first: one set of effects either way)
    assert interrupts_expire_task() == 0  # called again: nothing left to expire
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    result = ask_result(run.id)
    assert (result["is_error"], result["status"]) == (True, "timed_out")
    assert Interrupt.objects.get(id=row.id).status == InterruptStatus.TIMED_OUT
    late = resolve(http, row, answer="yes")
    assert (late.status_code, late.json()["code"]) == (410, "interrupt_expired")


def test_a_resolve_after_the_deadline_times_the_ask_out_itself(no_workers: None) -> None:
    """No sweep has run yet: the resolve sees the deadline, gives the run its timeout and says 410."""
    run = ask_run()
    engine.run_iterate(run_id=run.id, step=0)
    row = Interrupt.objects.get(run_id=run.id)
    Interrupt.objects.filter(id=row.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(Gone):
        interrupts.interrupt_resolve(
            tenant_id=None, owner=None, run_id=run.id, interrupt_id=row.id, reply=interrupts.Resolve(answer="yes")
        )
    assert Interrupt.objects.get(id=row.id).status == InterruptStatus.TIMED_OUT
    assert Run.objects.get(id=run.id).status == RunStatus.RUNNING  # woken once, for the next iteration


def test_an_answer_and_a_note_are_stored_redacted(no_workers: None) -> None:
    """A human pasting the run's credential into a reply: the interrupt row keeps it masked, as the transcript does."""
    secret = "cred-gh-9f8e7d6c5b4a"
    free = [{"tool": "Interruption", "input": {"op": "ask", "question": "token?"}}]  # no options: any answer
    for reply, column in (
        (interrupts.Resolve(answer={"token": secret}), "answer"),
        (interrupts.Resolve(answer=None, disposition="declined", note=f"use {secret} yourself"), "note"),
    ):
        prompt = "MOCK_SCRIPT: " + json.dumps([{"tools": free}, {"text": "done"}])
        data = services.RunCreate(
            agent="asker", segments=[Segment(text=prompt)], user_id="u1", credentials={"github": secret}
        )
        run = services.run_create(principal=ALICE, data=data)
        engine.run_iterate(run_id=run.id, step=0)
        row = Interrupt.objects.get(run_id=run.id)
        interrupts.interrupt_resolve(tenant_id=None, owner=None, run_id=run.id, interrupt_id=row.id, reply=reply)
        stored = Interrupt.objects.values(column).get(id=row.id)[column]
        assert stored and secret not in json.dumps(stored), stored


def test_an_ask_answered_after_every_worker_was_restarted(stack: WorkerPool, http: httpx.Client) -> None:
    run = ask_run()
    row = parked(run)
    for pid in stack.pids():
        stack.kill(pid)
    stack.ensure()  # new worker processes: nothing of the ask lived in the old ones
    assert resolve(http, row, answer="no").status_code == 200
    wait_status(run.id, RunStatus.COMPLETED, timeout=60)
    assert ask_result(run.id)["answer"] == "no"


def test_max_pending_refuses_the_ask_past_the_cap(stack: WorkerPool, http: httpx.Client) -> None:
    second = {**ASK, "question": "And staging?"}
    both = [{"tool": "Interruption", "input": ASK}, {"tool": "Interruption", "input": second}]
    run = ask_run("asker-one", tools=both)
    row = parked(run)
    assert row.question == ASK["question"]  # the first ask of the turn parks; the second is refused
    refused = [r for r in events(run.id, "tool_result") if r["is_error"]]
    assert len(refused) == 1 and "max_pending reached" in refused[0]["text"]
    assert resolve(http, row, answer="yes").status_code == 200
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)


def test_the_tool_is_refused_unless_the_agent_enables_it(stack: WorkerPool) -> None:
    run = ask_run("asker-off")
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    (result,) = events(run.id, "tool_result")
    assert result["is_error"] and "does not enable it" in result["text"]
    assert not Interrupt.objects.filter(run_id=run.id).exists()


def test_a_cancelled_run_cancels_its_ask(stack: WorkerPool, http: httpx.Client) -> None:
    run = ask_run()
    row = parked(run)
    services.run_cancel(principal=ALICE, agent_id=run.agent_id, reason="no longer needed")
    wait_status(run.id, RunStatus.CANCELLED, timeout=10)
    assert http.get("/v1/users/u1/interrupts").json()["interrupts"] == []  # gone from the inbox at once
    resp = resolve(http, row, answer="yes")
    # run_terminal when this resolve found the run ended; interrupt_not_pending if beat's sweep
    # (every 5 s) cancelled the ask first. Either way the ask is cancelled and the run untouched.
    assert resp.status_code == 409 and resp.json()["code"] in ("run_terminal", "interrupt_not_pending")
    assert Interrupt.objects.get(id=row.id).status == InterruptStatus.CANCELLED
    assert not events(run.id, "tool_result")


def test_every_route_is_tenant_scoped(stack: WorkerPool, http: httpx.Client, people: dict[str, Any]) -> None:
    acme = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
    run = ask_run(principal=acme)
    row = parked(run)
    inbox = f"/v1/users/{row.user_id}/interrupts"  # a tenant principal's runs are its subject's (alice)
    charlie = people["charlie"]  # tenant beta: acme's run and interrupt do not exist for him
    assert http.get(f"/v1/runs/{run.id}/interrupts", headers=charlie).status_code == 404
    assert http.get(inbox, headers=charlie).json()["interrupts"] == []
    refused = resolve(http, row, charlie, answer="yes")
    assert (refused.status_code, refused.json()["code"]) == (404, "not_found")
    assert Interrupt.objects.get(id=row.id).status == InterruptStatus.PENDING

    bob = people["bob"]  # acme, runs:create + runs:read
    assert [i["interrupt_id"] for i in http.get(inbox, headers=bob).json()["interrupts"]] == [row.id]
    assert http.get(f"/v1/runs/{run.id}/interrupts", headers=bob).status_code == 200
    assert resolve(http, row, bob, answer="yes").status_code == 200
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)


def test_the_admin_answer_form_resolves_through_the_service(stack: WorkerPool, admin_client: Client) -> None:
    run = ask_run()
    row = parked(run)
    listing = admin_client.get(reverse("admin:runs_interrupt_changelist"))
    assert listing.status_code == 200 and row.id in listing.content.decode()
    url = reverse("admin:runs_interrupt_answer", args=[quote(row.id)])
    assert f'<a href="{url}">answer</a>' in listing.content.decode()  # the listing links the form
    page = admin_client.get(url)
    assert page.status_code == 200 and ASK["question"] in page.content.decode()
    wrong = admin_client.post(url, {"disposition": "declined", "answer": "yes"})
    assert wrong.status_code == 200 and "decline_with_answer" in wrong.content.decode()  # refused by the service
    done = admin_client.post(url, {"disposition": "answer", "answer": "no"})
    assert done.status_code == 302
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    answered = Interrupt.objects.get(id=row.id)
    assert (answered.status, answered.answer, answered.resolved_by) == ("resolved", "no", "admin:admin")
    assert ask_result(run.id)["resolved_by"] == "admin:admin"


def test_an_mcp_client_resolves_through_interruption_resolve(
    stack: WorkerPool, web: str, people: dict[str, Any]
) -> None:
    acme = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
    run = ask_run(principal=acme)
    row = parked(run)
    args = {"run_id": run.id, "interrupt_id": row.id}

    async def work(client: McpClient) -> tuple[tuple[bool, dict[str, Any]], ...]:
        return (
            await mcp_call(client, "interruption_resolve", {**args, "answer": "maybe"}),
            await mcp_call(client, "interruption_resolve", {**args, "answer": "no"}),
        )

    beta = over_http(web, people["charlie"], lambda c: mcp_call(c, "interruption_resolve", {**args, "answer": "no"}))
    assert beta[0] and beta[1]["code"] == "not_found"  # another tenant's interrupt does not exist
    (bad_error, bad), (error, ok) = over_http(web, people["alice"], work)  # /v1/_mcp needs substrate:tenant
    assert bad_error and (bad["status"], bad["code"]) == (422, "answer_not_in_options")
    assert not error and ok["status"] == "resolved"
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    assert (ask_result(run.id)["answer"], ask_result(run.id)["resolved_by"]) == ("no", "mcp")
