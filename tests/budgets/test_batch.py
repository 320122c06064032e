"""`POST /v1/runs:batch` over a hard budget (issue 37): each refused item is its own
entry with the admission's `token_limit_exceeded`; items within budget run."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from apps.budgets import services
from apps.budgets.models import TokenLimit
from apps.runs.models import Run

pytestmark = pytest.mark.usefixtures("agents", "stack")


@pytest.fixture(autouse=True)
def _no_limits(agents: None) -> Iterator[None]:
    TokenLimit.objects.all().delete()
    yield
    TokenLimit.objects.all().delete()


@pytest.mark.parametrize("mode", ["join", "detach"])
def test_batch_items_over_a_hard_budget_are_token_limit_exceeded_entries(
    http: httpx.Client, people: dict[str, Any], mode: str
) -> None:
    spec = services.LimitSpec(tenant_id="acme", scope="agent", scope_id="spawner", hard_limit=Decimal(0))
    services.limit_put(spec=spec, updated_by="test")
    spawns = [{"agent": "spawner", "prompt": "hi"}, {"agent": "echo", "prompt": "hi"}]
    reply = http.post("/v1/runs:batch", json={"spawns": spawns, "mode": mode}, headers=people["bob"], timeout=60)
    assert reply.status_code == 200, reply.text
    refused, ran = reply.json()["results"]
    assert (refused["run_id"], refused["status"]) == ("", "failed")
    assert refused["error"].startswith("token_limit_exceeded:"), refused
    assert ran["run_id"] and ran["error"] == "" and reply.json()["spawned"] == 1
    assert not Run.objects.filter(tenant_id="acme", agent_name="spawner").exists()
