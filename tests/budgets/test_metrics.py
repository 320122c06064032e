"""Spend in Prometheus (issue 37): token and cost counters by provider, model and
tenant from run steps (a real worker) and gateway calls, the tenant label bounded
(the biggest spenders keep theirs, the rest fold into `other`), and a gauge of
each hard budget's remaining fraction."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import httpx
import pytest
from django.db.models import Sum
from prometheus_client.parser import text_string_to_metric_families

from apps.budgets import services
from apps.budgets.models import TokenLimit
from apps.core.metrics import Series
from apps.gateway.models import UsageEntry
from apps.runs.models import RunStatus
from loomcycle_project.metrics import fold_tenants, render
from tests.conftest import wait_for, wait_status
from tests.factories.runs import start

pytestmark = pytest.mark.usefixtures("agents", "stack")


@pytest.fixture(autouse=True)
def _no_limits(agents: None) -> Iterator[None]:
    TokenLimit.objects.all().delete()
    yield
    TokenLimit.objects.all().delete()


def samples(name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(render().decode()):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def input_tokens(tenant: str, model: str) -> float:
    key = (("kind", "input"), ("model", model), ("provider", "mock"), ("tenant", tenant))
    return samples("loomcycle_usage_tokens_total").get(key, 0.0)


def test_a_runs_tokens_are_counted_by_provider_model_and_tenant() -> None:
    before = input_tokens("", "mock-generic")
    run = start("echo", user_id="u-metrics")
    assert wait_status(run.id, RunStatus.COMPLETED).status == RunStatus.COMPLETED
    spent = UsageEntry.objects.filter(run_id=run.id).aggregate(i=Sum("input_tokens"))["i"]
    wait_for(lambda: input_tokens("", "mock-generic") - before >= spent, timeout=10)


def test_gateway_calls_are_counted_too(http: httpx.Client) -> None:
    before = input_tokens("", "mock-generic")
    body = {"messages": [{"role": "user", "content": "hi"}], "loomcycle_provider": "mock", "model": "mock-generic"}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    wait_for(lambda: input_tokens("", "mock-generic") > before, timeout=10)


def test_tenants_past_the_label_cap_fold_into_other() -> None:
    stored = {
        "loomcycle_usage_tokens": [
            Series(values=("p", "m", "big", "input"), total=100.0),
            Series(values=("p", "m", "mid", "input"), total=10.0),
            Series(values=("p", "m", "small", "input"), total=1.0),
        ],
        "loomcycle_usage_cost_usd": [Series(values=("p", "m", "small"), total=0.5)],
    }
    fold_tenants(stored, keep=1)
    assert {s.values[2]: s.total for s in stored["loomcycle_usage_tokens"]} == {"big": 100.0, "other": 11.0}
    assert [(s.values[2], s.total) for s in stored["loomcycle_usage_cost_usd"]] == [("other", 0.5)]


def test_each_hard_budget_reports_its_remaining_fraction() -> None:
    spec = services.LimitSpec(tenant_id="acme", scope="user", scope_id="u-gauge", hard_limit=Decimal(1000))
    services.limit_put(spec=spec, updated_by="test")
    gauge = samples("loomcycle_budget_remaining_ratio")
    key = (("kind", "tokens"), ("scope", "user"), ("scope_id", "u-gauge"), ("tenant", "acme"), ("window", "month"))
    assert gauge[key] == 1.0
