"""DELETE /v1/runs/{id} (issue 38, "Lifecycle"): an ended run tree goes with every row about
it, the usage ledger keeps its rows with the run reference cleared, a live tree is a 409
unless ?cancel=true, and another tenant's run is as absent as a missing one."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from apps.evaluations.models import Evaluation
from apps.gateway.models import UsageEntry
from apps.runs.models import Run, RunEvent, RunStatus, ToolCallRecord, TranscriptEntry
from apps.triggers.webhooks.models import Verdict, WebhookDelivery
from tests.conftest import wait_for, wait_status

pytestmark = pytest.mark.usefixtures("agents", "stack")


def _start(http: httpx.Client, headers: dict[str, str], agent: str, **extra: Any) -> dict[str, Any]:
    resp = http.post("/v1/runs", json={"agent": agent, "prompt": "hi", "background": True, **extra}, headers=headers)
    assert resp.status_code == 202, resp.text
    return dict(resp.json())


def _tree(root_id: str) -> list[str]:
    ids, frontier = [root_id], [root_id]
    while frontier:
        frontier = list(Run.objects.filter(parent_id__in=frontier).values_list("id", flat=True))
        ids += frontier
    return ids


def test_deleting_an_ended_tree_removes_its_rows_and_unlinks_its_ledger(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    run = _start(http, people["alice"], "spawner", user_id="u1")
    wait_status(run["run_id"], RunStatus.COMPLETED)
    ids = _tree(run["run_id"])
    assert len(ids) == 2  # the spawner and its echo child
    spend = sum(UsageEntry.objects.filter(run_id__in=ids).values_list("input_tokens", flat=True))
    assert spend > 0
    WebhookDelivery.objects.create(
        tenant_id="acme", webhook_name="w", delivery_id="d1", verdict=Verdict.ACCEPTED, first=True, run_id=ids[1]
    )
    Evaluation.objects.create(
        eval_id="eval_1",
        tenant_id="acme",
        run_id=ids[1],
        def_id="d",
        agent_name="echo",
        score=1.0,
        emitter_role="external",
    )

    resp = http.delete(f"/v1/runs/{run['run_id']}", headers=people["alice"])

    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["deleted"] is True and body["deleted_runs"] == 2
    assert body["counts"]["runs.RunEvent"] > 0 and body["counts"]["runs.TranscriptEntry"] > 0
    for model in (Run, RunEvent, TranscriptEntry, ToolCallRecord):
        assert not model.objects.filter(**{"id__in" if model is Run else "run_id__in": ids}).exists()
    assert not WebhookDelivery.objects.filter(run_id__in=ids).exists()
    assert not Evaluation.objects.filter(run_id__in=ids).exists()
    assert not UsageEntry.objects.filter(run_id__in=ids).exists()
    assert sum(UsageEntry.objects.filter(tenant_id="acme").values_list("input_tokens", flat=True)) == spend
    assert http.get(f"/v1/runs/{run['run_id']}", headers=people["alice"]).status_code == 404
    # Deleting it again: the run is gone, as a missing one.
    assert http.delete(f"/v1/runs/{run['run_id']}", headers=people["alice"]).status_code == 404


def test_a_live_tree_is_refused_unless_cancel_is_asked(http: httpx.Client, people: dict[str, dict[str, str]]) -> None:
    run = _start(http, people["alice"], "chat")
    wait_status(run["run_id"], RunStatus.AWAITING_INPUT)

    refused = http.delete(f"/v1/runs/{run['run_id']}", headers=people["alice"])
    assert refused.status_code == 409 and refused.json()["code"] == "run_live"
    assert Run.objects.filter(id=run["run_id"]).exists()

    resp = http.delete(f"/v1/runs/{run['run_id']}", params={"cancel": "true"}, headers=people["alice"])
    assert resp.status_code in (200, 202), resp.text
    wait_for(lambda: not Run.objects.filter(id=run["run_id"]).exists())
    assert not RunEvent.objects.filter(run_id=run["run_id"]).exists()


def test_a_running_tree_deleted_with_cancel_goes_when_its_worker_ends_it(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    run = _start(http, people["alice"], "very-slow")
    wait_status(run["run_id"], RunStatus.RUNNING)

    resp = http.delete(f"/v1/runs/{run['run_id']}", params={"cancel": "true"}, headers=people["alice"])

    # 202 while its worker still holds it (deleted when it ends), 200 when the cancel ended it at once.
    assert (resp.status_code, resp.json()["deleting"]) in ((202, True), (200, False)), resp.text
    wait_for(lambda: not Run.objects.filter(id=run["run_id"]).exists())
    assert not RunEvent.objects.filter(run_id=run["run_id"]).exists()


def test_another_tenant_and_a_member_without_the_scope_cannot_delete(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    run = _start(http, people["alice"], "echo")
    wait_status(run["run_id"], RunStatus.COMPLETED)

    foreign = http.delete(f"/v1/runs/{run['run_id']}", headers=people["charlie"])
    missing = http.delete("/v1/runs/r_0000000000000000", headers=people["charlie"])
    member = http.delete(f"/v1/runs/{run['run_id']}", headers=people["bob"])

    assert (
        (foreign.status_code, foreign.json()["code"])
        == (missing.status_code, missing.json()["code"])
        == (
            404,
            "not_found",
        )
    )
    assert member.status_code == 403 and member.json()["code"] == "insufficient_scope"
    assert Run.objects.filter(id=run["run_id"]).exists()
