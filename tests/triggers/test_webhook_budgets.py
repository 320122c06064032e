"""A webhook delivery into a spent budget (issue 37): 429 `token_limit_exceeded` with the
window's Retry-After, the delivery recorded as a spawn-setup refusal naming the code, and no run."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest

from apps.budgets import services
from apps.budgets.models import TokenLimit
from apps.runs.models import Run
from apps.triggers.webhooks.models import Verdict, WebhookDelivery
from tests.triggers.conftest import define, github, payload, post

pytestmark = pytest.mark.usefixtures("agents")


@pytest.fixture(autouse=True)
def _no_limits(agents: None) -> Iterator[None]:
    TokenLimit.objects.all().delete()
    yield
    TokenLimit.objects.all().delete()


def test_a_delivery_over_a_hard_budget_is_429_token_limit_exceeded(hook_webs: list[str]) -> None:
    define("spendthrift", agent="spawner")
    spec = services.LimitSpec(tenant_id="", scope="agent", scope_id="spawner", hard_limit=Decimal(0))
    services.limit_put(spec=spec, updated_by="test")
    body = payload(n=1)
    resp = post(hook_webs[0], "spendthrift", body, github(body))
    assert (resp.status_code, resp.json()["code"]) == (429, "token_limit_exceeded"), resp.text
    assert int(resp.headers["Retry-After"]) >= 1
    [row] = WebhookDelivery.objects.filter(webhook_name="spendthrift")
    assert row.verdict == Verdict.REJECTED_SPAWN_SETUP and row.detail.startswith("token_limit_exceeded:")
    assert not row.first and row.run_id == ""
    assert not Run.objects.filter(agent_name="spawner", tenant_id="").exists()
