"""A person's erasure (issue 38, "Lifecycle"): the report counts what is held about them, the
execute removes it all through each app's service in bounded batches, a `pg_dump` of the whole
database afterwards holds none of their marker strings, a kill -9 mid-erasure leaves it
resumable, and another tenant's person of the same id is out of reach."""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import signal
import subprocess
import sys
from typing import Any

import httpx
import pytest
from django.utils import timezone

from apps.channels.models import ChannelMessage
from apps.core.identity import ACT_AS_USER_SCOPE
from apps.core.types import Principal
from apps.gateway.models import UsageEntry
from apps.lifecycle.erasure import erasure_execute
from apps.lifecycle.models import Erasure, ErasureStatus
from apps.memory.models import MemoryEntry
from apps.memory.services import Slot, memory_set
from apps.runs.models import Run, RunStatus
from apps.substrate import tokens
from apps.triggers.webhooks.models import Verdict, WebhookDelivery
from tests.conftest import wait_for, wait_status
from tests.factories.runs import _pg_dump

PERSON = "u-erase-7c1"
MARK = "gdprmark9e2b"  # in everything the person's runs, memory and messages hold
KEEP = "keepmark41d0"  # in what other people (and the person's namesake in beta) hold
ACME = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))


def _app(tenant: str) -> dict[str, str]:
    """The tenant's application token: it starts runs on behalf of its users (`user_id`)."""
    name = f"{tenant}-app-{secrets.token_hex(3)}"
    token = tokens.token_create(name=name, tenant_id=tenant, subject="app", scopes=["runs:create", ACT_AS_USER_SCOPE])
    return {"authorization": f"Bearer {token['token']}"}


def _run(http: httpx.Client, tenant: str, user: str, text: str, webhook: dict[str, Any] | None = None) -> str:
    body = {"agent": "spawner", "prompt": text, "background": True, "user_id": user}
    if webhook is not None:
        body["webhook"] = webhook
    resp = http.post("/v1/runs", json=body, headers=_app(tenant))
    assert resp.status_code == 202, resp.text
    run_id = str(resp.json()["run_id"])
    wait_status(run_id, RunStatus.COMPLETED)
    return run_id


def _held(http: httpx.Client, people: dict[str, dict[str, str]]) -> None:
    """The person's data in acme, another acme user's, and a namesake's in beta."""
    # The first run carries a completion webhook: its delivery row (the person's user id, a URL
    # with the marker) is written with the run's end, and must go with the run.
    hook = {"url": f"http://127.0.0.1:9/{MARK}"}  # nothing listens: the delivery stays pending
    mine = [_run(http, "acme", PERSON, f"{MARK} plan {i}", hook if i == 0 else None) for i in range(2)]
    _run(http, "acme", "u-other", f"{KEEP} acme")
    _run(http, "beta", PERSON, f"{KEEP} beta namesake")
    memory_set(slot=Slot("acme", "user", PERSON), key="profile", value={"note": f"{MARK} likes tea"})
    memory_set(slot=Slot("beta", "user", PERSON), key="profile", value={"note": f"{KEEP} beta"})
    for tenant, text in (("acme", MARK), ("beta", KEEP)):
        ChannelMessage.objects.create(
            id=f"msg_{tenant}{PERSON[-3:]}",
            tenant_id=tenant,
            channel="inbox",
            scope="user",
            scope_id=PERSON,
            payload={"text": f"{text} said hello"},
            published_at=timezone.now(),
            visible_at=timezone.now(),
            published_by=mine[0],
            published_by_user_id=PERSON,
        )
    WebhookDelivery.objects.create(
        tenant_id="acme",
        webhook_name="crm",
        delivery_id="d-1",
        verdict=Verdict.ACCEPTED,
        first=True,
        run_id=mine[0],
        detail=f"{MARK} from the crm",
    )


def _tables_naming(dump: str, needle: str) -> set[str]:
    """The tables whose COPY block in a --data-only dump holds `needle`."""
    found = set()
    for block in re.split(r"\nCOPY ", dump):
        if needle in block:
            found.add(block.split(" ", 1)[0])
    return found


@pytest.mark.usefixtures("agents", "stack")
def test_after_an_erase_a_pg_dump_holds_none_of_the_persons_data(
    http: httpx.Client, people: dict[str, dict[str, str]], stack_env: dict[str, str]
) -> None:
    _held(http, people)
    report = http.get("/v1/_erasure", params={"subject": PERSON}, headers=people["alice"]).json()
    counts = report["tier1_covered"]["counts"]
    assert counts["runs.Run"] == 4 and counts["runs.Session"] == 2  # two spawners, each with a child
    assert counts["memory.MemoryEntry"] == 1 and counts["channels.ChannelMessage"] == 1
    assert counts["gateway.UsageEntry"] >= 4 and report["tier2_uncovered"]["counts"]["triggers.WebhookDelivery"] == 1
    assert counts["runs.RunWebhook"] == 1 and counts["runs.RunWebhookDelivery"] == 1  # the first run's end
    assert MARK in _pg_dump(stack_env["DATABASE_URL"])  # the dump sees it before
    spend = sum(UsageEntry.objects.filter(tenant_id="acme").values_list("input_tokens", flat=True))

    body = {"subject": PERSON, "dry_run": False, "confirm": PERSON}
    resp = http.post("/v1/_erasure", json=body, headers=people["alice"])

    assert resp.status_code == 200, resp.text
    done = resp.json()
    assert done["status"] == "done" and done["deleted"]["runs.Run"] == 4
    assert done["deleted"]["runs.RunWebhookDelivery"] == 1 and done["deleted"]["runs.RunWebhook"] == 1
    dump = _pg_dump(stack_env["DATABASE_URL"])
    assert MARK not in dump
    assert KEEP in dump  # everyone else's data stays, the namesake's in beta too
    assert _tables_naming(dump, PERSON) <= {"public.lifecycle_erasure", *_beta_tables(dump)}
    assert sum(UsageEntry.objects.filter(tenant_id="acme").values_list("input_tokens", flat=True)) == spend
    audit = Erasure.objects.get(tenant_id="acme", user_id=PERSON)
    assert audit.status == ErasureStatus.DONE and audit.requested_by == "alice" and audit.finished_at is not None
    assert MARK not in str(audit.counts)


def _beta_tables(dump: str) -> set[str]:
    """Tables where the namesake in beta is named: every line naming the person there says beta."""
    tables = set()
    for block in re.split(r"\nCOPY ", dump):
        lines = [line for line in block.splitlines() if PERSON in line]
        if lines and all("beta" in line or KEEP in line for line in lines):
            tables.add(block.split(" ", 1)[0])
    return tables


@pytest.mark.usefixtures("agents", "stack")
def test_dry_run_is_the_default_and_a_real_one_needs_confirm(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    run_id = _run(http, "acme", PERSON, "hello")

    dry = http.post("/v1/_erasure", json={"subject": PERSON}, headers=people["alice"])
    unconfirmed = http.post("/v1/_erasure", json={"subject": PERSON, "dry_run": False}, headers=people["alice"])
    member = http.post("/v1/_erasure", json={"subject": PERSON}, headers=people["bob"])

    assert dry.status_code == 200 and dry.json()["dry_run"] is True
    assert unconfirmed.status_code == 400 and unconfirmed.json()["code"] == "confirm_mismatch"
    assert member.status_code == 403
    assert Run.objects.filter(id=run_id).exists() and not Erasure.objects.exists()


@pytest.mark.usefixtures("agents", "stack")
def test_an_erasure_cannot_reach_another_tenants_person(http: httpx.Client, people: dict[str, dict[str, str]]) -> None:
    run_id = _run(http, "acme", PERSON, "acme's")

    resp = http.post(
        "/v1/_erasure", json={"subject": PERSON, "dry_run": False, "confirm": PERSON}, headers=people["charlie"]
    )

    assert resp.status_code == 200 and resp.json()["tenant"] == "beta" and resp.json()["deleted"] == {}
    assert Run.objects.filter(id=run_id).exists()


_EXECUTE = f"""
from apps.core.identity import ACT_AS_USER_SCOPE
from apps.core.types import Principal
from apps.lifecycle.erasure import erasure_execute
erasure_execute(principal=Principal(tenant_id="acme", subject="alice", scopes=frozenset()),
                user_id="{PERSON}", dry_run=False, confirm="{PERSON}")
"""


@pytest.mark.usefixtures("agents")
def test_a_kill_9_mid_erasure_then_a_rerun_finishes_it_with_exact_counts(
    stack_env: dict[str, str], settings: Any
) -> None:
    rows = 400
    MemoryEntry.objects.bulk_create(
        MemoryEntry(tenant_id="acme", scope="user", scope_id=PERSON, key=f"k{i}", value={"v": MARK})
        for i in range(rows)
    )
    env = {**stack_env, "LOOMCYCLE_ERASURE_BATCH": "1"}  # one row per transaction: a kill lands mid-way
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-c", _EXECUTE],
        env=env,
        cwd=os.getcwd(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (
                (e := Erasure.objects.filter(user_id=PERSON).first()) and e.counts.get("memory.MemoryEntry", 0) >= 20
            ),
            timeout=60,
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    killed = Erasure.objects.get(user_id=PERSON)
    left = MemoryEntry.objects.filter(scope_id=PERSON).count()
    assert killed.status == ErasureStatus.RUNNING and 0 < left < rows
    assert killed.counts["memory.MemoryEntry"] == rows - left  # each batch's count committed with its delete

    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, erasure_batch=50)
    again = erasure_execute(principal=ACME, user_id=PERSON, dry_run=False, confirm=PERSON)

    assert again["erasure_id"] == killed.id and again["status"] == "done"
    assert again["deleted"]["memory.MemoryEntry"] == rows
    assert not MemoryEntry.objects.filter(scope_id=PERSON).exists()
