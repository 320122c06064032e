"""Delivery records: a replay after the web process restarts still finds the
first run (dedupe lives in Postgres, not in a process), and records past
their retention are pruned on insert, at most once a minute; a signed body
re-sent under a fresh delivery id is a replay."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.urls import reverse
from django.utils import timezone

from apps.core.redis import sync_client
from apps.triggers.webhooks.models import Verdict, WebhookDelivery
from apps.triggers.webhooks.services import PRUNE_GUARD_KEY, delivery_record
from tests.conftest import daphne
from tests.triggers.conftest import WEB_ENV, define, github, payload, post, stripe


@pytest.mark.usefixtures("agents")
def test_a_replay_after_a_restart_returns_the_first_run(stack_env: dict[str, str], logdir: Path, stack: Any) -> None:
    define("restart", auth={"signing_secret_env": "LOOMCYCLE_WH_SECRET", "delivery_id_header": "X-Delivery"})
    body = payload(n=1)
    headers = {**github(body), "X-Delivery": "before-restart"}
    with daphne(stack_env, logdir, "daphne-webhooks-restart-a", **WEB_ENV) as base:
        first = post(base, "restart", body, headers)
    with daphne(stack_env, logdir, "daphne-webhooks-restart-b", **WEB_ENV) as base:
        again = post(base, "restart", body, headers)
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["run_id"] == first.json()["run_id"] and again.json()["deduped"] == "true"


@pytest.mark.django_db
def test_records_past_retention_are_pruned_on_insert_once_a_minute(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, webhooks_delivery_retention_hours=1)
    old = WebhookDelivery.objects.create(webhook_name="aged", delivery_id="old", verdict=Verdict.REJECTED_SIG)
    WebhookDelivery.objects.filter(pk=old.pk).update(received_at=timezone.now() - timedelta(hours=2))
    sync_client().delete(PRUNE_GUARD_KEY)
    delivery_record(owner="", name="aged", delivery_id="new", verdict=Verdict.REJECTED_SIG)
    assert list(WebhookDelivery.objects.values_list("delivery_id", flat=True)) == ["new"]
    again = WebhookDelivery.objects.create(webhook_name="aged", delivery_id="old-2", verdict=Verdict.REJECTED_SIG)
    WebhookDelivery.objects.filter(pk=again.pk).update(received_at=timezone.now() - timedelta(hours=2))
    delivery_record(owner="", name="aged", delivery_id="newer", verdict=Verdict.REJECTED_SIG)
    assert WebhookDelivery.objects.filter(delivery_id="old-2").exists()  # the guard holds for a minute
    assert 0 < sync_client().ttl(PRUNE_GUARD_KEY) <= 60


@pytest.mark.django_db
def test_the_admin_lists_rejected_deliveries_by_verdict(admin_client: Any) -> None:
    delivery_record(
        owner="", name="gh", delivery_id="d-bad", verdict=Verdict.REJECTED_SIG, detail="signature does not match"
    )
    delivery_record(owner="", name="gh", delivery_id="d-replay", verdict=Verdict.ACCEPTED_REPLAY)
    page = admin_client.get(reverse("admin:triggers_webhookdelivery_changelist"), {"verdict__exact": "rejected_sig"})
    assert page.status_code == 200
    html = page.content.decode()
    assert "d-bad" in html and "signature does not match" in html and "d-replay" not in html


# --- a captured delivery re-sent under a fresh delivery id (the id header is unsigned) ---

BODY_MACS = {
    "github": lambda body: github(body),
    "hex": lambda body: {"X-Hub-Signature-256": github(body)["X-Hub-Signature-256"][len("sha256=") :]},
}


@pytest.mark.usefixtures("agents")
@pytest.mark.parametrize("fmt", sorted(BODY_MACS))
def test_a_signed_body_replayed_with_a_fresh_delivery_id_is_deduped(hook_webs: list[str], fmt: str) -> None:
    name = f"resend-{fmt}"
    define(name, auth={"signing_secret_env": "LOOMCYCLE_WH_SECRET", "format": fmt, "delivery_id_header": "X-Delivery"})
    body = payload(event="push", n=1)
    first = post(hook_webs[0], name, body, {**BODY_MACS[fmt](body), "X-Delivery": "gh-1"})
    replayed = post(hook_webs[1], name, body, {**BODY_MACS[fmt](body), "X-Delivery": "attacker-2"})
    assert first.status_code == 202, first.text
    assert replayed.status_code == 200, replayed.text
    assert replayed.json() == {
        "webhook_name": name,
        "delivery_id": "attacker-2",
        "run_id": first.json()["run_id"],
        "deduped": "true",
    }
    firsts = WebhookDelivery.objects.filter(webhook_name=name, first=True)
    assert list(firsts.values_list("delivery_id", flat=True)) == ["gh-1"]
    replay = WebhookDelivery.objects.get(webhook_name=name, verdict=Verdict.ACCEPTED_REPLAY)
    assert replay.detail == "same signed bytes as delivery gh-1"


async def _resend_all(bases: list[str], body: bytes, n: int) -> list[tuple[int, dict[str, Any]]]:
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> tuple[int, dict[str, Any]]:
            headers = {**github(body), "X-Delivery": f"fresh-{i}"}
            resp = await client.post(f"{bases[i % 2]}/v1/_webhooks/resend-race", content=body, headers=headers)
            return resp.status_code, resp.json()

        return await asyncio.gather(*(one(i) for i in range(n)))


@pytest.mark.usefixtures("agents")
def test_simultaneous_resends_under_fresh_ids_make_one_run(hook_webs: list[str]) -> None:
    """Copies racing on two web processes meet at the signed-digest index, not in memory."""
    auth = {"signing_secret_env": "LOOMCYCLE_WH_SECRET", "delivery_id_header": "X-Delivery"}
    define("resend-race", auth=auth, rate_limit={"requests_per_minute": 6000, "burst": 100})
    answers = asyncio.run(_resend_all(hook_webs, payload(n=7), 16))
    assert sorted(status for status, _ in answers) == [200] * 15 + [202]
    assert len({out["run_id"] for _, out in answers}) == 1
    assert WebhookDelivery.objects.filter(webhook_name="resend-race", first=True).count() == 1


@pytest.mark.usefixtures("agents")
def test_a_stripe_delivery_is_deduped_on_its_signed_stamp_and_body(hook_webs: list[str]) -> None:
    """The same `t` and body under a fresh id is a replay; the sender re-signing the
    body with a new `t` is a new delivery (a replayer cannot: it has no secret)."""
    auth = {"signing_secret_env": "LOOMCYCLE_WH_SECRET", "format": "stripe", "delivery_id_header": "X-Delivery"}
    define("resend-stripe", auth=auth)
    body, now = payload(event="charge"), int(time.time())
    captured = stripe(body, at=now - 30)
    first = post(hook_webs[0], "resend-stripe", body, {**captured, "X-Delivery": "evt-1"})
    replayed = post(hook_webs[1], "resend-stripe", body, {**captured, "X-Delivery": "evt-2"})
    resigned = post(hook_webs[1], "resend-stripe", body, {**stripe(body, at=now), "X-Delivery": "evt-3"})
    assert (first.status_code, replayed.status_code, resigned.status_code) == (202, 200, 202)
    assert replayed.json()["run_id"] == first.json()["run_id"] != resigned.json()["run_id"]
