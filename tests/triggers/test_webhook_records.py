"""Delivery records: a replay after the web process restarts still finds the
first run (dedupe lives in Postgres, not in a process), and records past
their retention are pruned on insert, at most once a minute."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.core.redis import sync_client
from apps.triggers.webhooks.models import Verdict, WebhookDelivery
from apps.triggers.webhooks.services import PRUNE_GUARD_KEY, delivery_record
from tests.conftest import daphne
from tests.triggers.conftest import WEB_ENV, define, github, payload, post


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
