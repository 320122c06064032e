"""Completion webhooks (issue 38): a run's `webhook` is POSTed, signed (Standard Webhooks, verified
here with the `standardwebhooks` package), when it ends; the delivery row is written with the end,
retried with backoff, visible in the API; across a worker kill a receiver on loopback sees exactly
one successful delivery per run. Real workers, a real HTTP receiver on loopback."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from django.utils import timezone
from standardwebhooks import Webhook as Verifier

from apps.core.errors import Invalid
from apps.runs import services
from apps.runs.completion import services as completion
from apps.runs.models import Run, RunStatus, RunWebhook, RunWebhookDelivery
from tests.conftest import ALICE, RUN_WEBHOOK_SECRET, wait_for, wait_status
from tests.factories.runs import start
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents", "stack")


class Receiver:
    """A loopback HTTP server that records every POST and answers the scripted statuses (then 200)."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], str, int]] = []
        self.script: list[int] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"])).decode()
                with receiver.lock:
                    status = receiver.script.pop(0) if receiver.script else 200
                    receiver.posts.append(({k.lower(): v for k, v in self.headers.items()}, body, status))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                """Quiet: the test reads `receiver.posts`, not the access log."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://localhost:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def delivered(self) -> dict[str, set[str]]:
        """run_id -> the webhook-ids of the POSTs answered 2xx, each verified."""
        out: dict[str, set[str]] = {}
        with self.lock:
            for headers, body, status in self.posts:
                payload = Verifier(RUN_WEBHOOK_SECRET).verify(body, headers)
                if status < 300:
                    out.setdefault(payload["run"]["run_id"], set()).add(headers["webhook-id"])
        return out


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, run_webhook_secret=RUN_WEBHOOK_SECRET)
    r = Receiver()
    yield r
    r.server.shutdown()


def _scripted(receiver: Receiver, **webhook: Any) -> Run:
    prompt = "MOCK_SCRIPT: " + json.dumps([{"text": "all done"}])
    return start("scripted", prompt, webhook={"url": receiver.url, **webhook})


def test_a_run_end_is_posted_once_signed_with_the_run_in_the_body(
    receiver: Receiver, http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    run = _scripted(receiver)
    wait_for(lambda: receiver.delivered().get(run.id))
    headers, body, _ = receiver.posts[0]
    payload = Verifier(RUN_WEBHOOK_SECRET).verify(body, headers)
    assert payload["type"] == "run.completed" and payload["id"] == headers["webhook-id"]
    assert payload["run"]["status"] == "completed" and payload["run"]["output"] == "all done"
    row = wait_for(lambda: RunWebhookDelivery.objects.filter(run_id=run.id, state="delivered").first())
    assert (row.attempts, row.last_status, row.event) == (1, 200, "completed")
    assert len(receiver.posts) == 1
    with pytest.raises(Exception, match="signature"):  # another secret does not verify
        Verifier("whsec_" + "b3RoZXItc2VjcmV0").verify(body, headers)


def test_a_failing_receiver_is_retried_after_a_backoff_with_the_same_id(receiver: Receiver) -> None:
    receiver.script = [500]
    run = _scripted(receiver)
    first = wait_for(lambda: RunWebhookDelivery.objects.filter(run_id=run.id, attempts=1, last_status=500).first())
    assert first.state == "pending" and first.next_attempt_at > timezone.now() + timedelta(seconds=1)  # a backoff

    def retried() -> bool:
        completion.webhooks_sweep()  # beat's sweep: rings the row once its backoff is over
        return RunWebhookDelivery.objects.get(id=first.id).state == "delivered"

    wait_for(retried, timeout=20, interval=0.5)
    assert [h["webhook-id"] for h, _, _ in receiver.posts] == [first.id, first.id]
    assert receiver.delivered() == {run.id: {first.id}}


def test_park_events_are_posted_only_when_asked(receiver: Receiver) -> None:
    asked = start("chat-slow", "hi", webhook={"url": receiver.url, "events": ["awaiting_input"]})
    not_asked = start("chat-slow", "hi", webhook={"url": receiver.url})
    wait_status(not_asked.id, RunStatus.AWAITING_INPUT)
    wait_for(lambda: receiver.delivered().get(asked.id))
    assert RunWebhookDelivery.objects.get(run_id=asked.id).event == "awaiting_input"
    assert not RunWebhookDelivery.objects.filter(run_id=not_asked.id).exists()


def test_a_cancelled_run_is_announced_and_deleting_a_run_deletes_its_webhook_rows(receiver: Receiver) -> None:
    run = start("very-slow", "hi", webhook={"url": receiver.url})
    wait_status(run.id, RunStatus.RUNNING)
    services.run_cancel(principal=ALICE, agent_id=run.agent_id, reason="test")
    wait_for(lambda: receiver.delivered().get(run.id), timeout=30)
    assert RunWebhookDelivery.objects.get(run_id=run.id).event == "cancelled"
    Run.objects.filter(id=run.id).delete()  # the Django cascade a tree delete relies on
    assert not RunWebhookDelivery.objects.filter(run_id=run.id).exists()
    assert not RunWebhook.objects.filter(run_id=run.id).exists()


def test_exactly_one_successful_delivery_per_run_across_a_worker_kill(receiver: Receiver, stack: WorkerPool) -> None:
    runs = [start("slow", "hi", webhook={"url": receiver.url}) for _ in range(4)]
    pid = wait_for(lambda: next((p for r in runs if (p := _owner_pid(r.id))), 0))
    stack.kill(pid)  # kill -9 inside a provider call
    stack.ensure()
    for run in runs:
        wait_status(run.id, RunStatus.COMPLETED, timeout=60)
    ids = {r.id for r in runs}
    wait_for(lambda: ids <= set(receiver.delivered()), timeout=60, interval=0.3)
    delivered = receiver.delivered()
    assert all(len(delivered[r]) == 1 for r in ids)
    assert RunWebhookDelivery.objects.filter(run_id__in=ids).count() == len(ids)


def _owner_pid(run_id: str) -> int:
    owner = Run.objects.get(id=run_id).lease_owner
    return int(owner.split(":")[-2]) if owner else 0


@pytest.mark.parametrize(
    ("webhook", "code"),
    [
        ({"url": "ftp://example.com/x"}, "invalid_webhook"),
        ({"url": "https://example.com/x", "events": ["exploded"]}, "invalid_webhook"),
        ({"url": "https://example.com/x", "nope": 1}, "invalid_webhook"),
        ({"url": "https://example.com/x", "secret_ref": "DATABASE_URL"}, "invalid_webhook"),
        ({"url": "https://example.com/x", "secret_ref": "LOOMCYCLE_UNSET_WEBHOOK_SECRET"}, "webhook_secret_missing"),
    ],
)
def test_a_bad_webhook_is_refused_before_the_run_exists(settings: Any, webhook: dict[str, Any], code: str) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, run_webhook_secret=RUN_WEBHOOK_SECRET)
    before = Run.objects.count()
    with pytest.raises(Invalid) as err:
        start("scripted", "hi", webhook=webhook)
    assert err.value.code == code and Run.objects.count() == before


def test_no_secret_at_all_is_refused(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, run_webhook_secret=None)
    with pytest.raises(Invalid) as err:
        start("scripted", "hi", webhook={"url": "https://example.com/x"})
    assert err.value.code == "webhook_secret_missing"


def test_deliveries_are_visible_in_the_api_to_the_runs_tenant_only(
    receiver: Receiver, http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    run = _scripted(receiver)
    wait_for(lambda: RunWebhookDelivery.objects.filter(run_id=run.id, state="delivered").exists())
    admin = {"authorization": people["alice"]["authorization"]}
    Run.objects.filter(id=run.id).update(tenant_id="acme")
    resp = http.get(f"/v1/runs/{run.id}/webhooks", headers=admin)
    assert resp.status_code == 200, resp.text
    [row] = resp.json()["deliveries"]
    assert (row["state"], row["attempts"], row["event"]) == ("delivered", 1, "completed")
    other = http.get(f"/v1/runs/{run.id}/webhooks", headers=people["charlie"])
    assert (other.status_code, other.json()["code"]) == (404, "not_found")


def test_an_end_no_path_recorded_is_recorded_and_sent_by_the_sweep(receiver: Receiver) -> None:
    run = start("chat-slow", "hi", webhook={"url": receiver.url})
    wait_status(run.id, RunStatus.AWAITING_INPUT)  # parked: no worker holds it
    # An end written around the end paths (as an operator's SQL would): no delivery row yet.
    Run.objects.filter(id=run.id).update(status=RunStatus.FAILED, completed_at=timezone.now())
    completion.webhooks_sweep()  # beat's sweep too: whichever runs first records the end, once
    row = RunWebhookDelivery.objects.get(run_id=run.id)
    assert row.event == "failed"
    wait_for(lambda: receiver.delivered().get(run.id) == {row.id})
    completion.webhooks_sweep()  # recorded once: a second sweep adds nothing
    assert RunWebhookDelivery.objects.filter(run_id=run.id).count() == 1


def test_an_agents_default_webhook_is_used_when_the_run_names_none(
    receiver: Receiver, http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    overlay = {"provider": "mock", "model": "mock-script", "tools": [], "webhook": {"url": receiver.url}}
    made = http.post(
        "/v1/_agentdef", headers=people["alice"], json={"op": "create", "name": "acme-hooked", "overlay": overlay}
    )
    assert made.status_code == 200, made.text
    resp = http.post(
        "/v1/runs",
        headers=people["alice"],
        json={"agent": "acme-hooked", "prompt": 'MOCK_SCRIPT: [{"text": "hooked"}]', "background": True},
    )
    assert resp.status_code == 202, resp.text
    run_id = resp.json()["run_id"]
    wait_for(lambda: receiver.delivered().get(run_id))
    bad = {"provider": "mock", "model": "mock-script", "webhook": "https://example.com"}
    refused = http.post(
        "/v1/_agentdef", headers=people["alice"], json={"op": "create", "name": "acme-bad", "overlay": bad}
    )
    assert refused.status_code >= 400 and refused.json()["code"] == "tool_refused", refused.text
