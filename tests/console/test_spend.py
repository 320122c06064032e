"""The console's Spend page (apps/console/views/spend.py) in a real browser against the real
web process and workers: the charts' data points are the usage API's figures (GET /v1/_usage
grouped by day and agent, by day and model), a budget shows the remaining fraction GET
/v1/_limits implies, and another tenant sees none of it."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
from django.utils import timezone

from apps.core.types import Principal
from apps.gateway.models import UsageEntry, UsageSource
from apps.runs import services
from apps.runs.models import RunStatus
from apps.runs.prompt import Segment
from tests.conftest import wait_for, wait_status
from tests.console.conftest import Console, bearer

pytestmark = pytest.mark.usefixtures("web", "agents", "stack")

ALICE = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
TOKENS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def ledger(tenant: str, days_ago: int, model: str, run_id: str = "", cost: str | None = None, n: int = 100) -> None:
    """A past usage row as the gateway writes it (the ledger the usage report sums)."""
    UsageEntry.objects.create(
        created_at=timezone.now() - timedelta(days=days_ago),
        tenant_id=tenant,
        run_id=run_id,
        source=UsageSource.RUN if run_id else UsageSource.GATEWAY,
        provider="mock",
        model=model,
        input_tokens=n,
        output_tokens=n // 2,
        cache_read_input_tokens=n // 4,
        cost_usd=None if cost is None else Decimal(cost),
    )


def expected(groups: list[dict[str, Any]], by: str, value: str) -> dict[str, Any]:
    """What the chart must hold, computed here from the usage API's own answer."""
    days = sorted({g["day"] for g in groups})
    cells: dict[str, dict[str, float]] = defaultdict(dict)
    for g in groups:
        amount = float(sum(g[t] for t in TOKENS)) if value == "tokens" else float(Decimal(g["cost_usd"]))
        cells[g[by] or "(no agent)"][g["day"]] = amount
    datasets = [{"label": k, "data": [cells[k].get(d, 0.0) for d in days]} for k in sorted(cells)]
    return {"labels": days, "datasets": datasets}


def chart(page: Any, canvas: str) -> dict[str, Any]:
    page.wait_for_function(f"() => window.Chart && Chart.getChart('{canvas}') !== undefined")
    data: dict[str, Any] = page.evaluate(
        f"() => {{ const d = Chart.getChart('{canvas}').data;"
        " return {labels: d.labels, datasets: d.datasets.map(s => ({label: s.label, data: s.data}))}; }"
    )
    return data


def test_the_spend_charts_hold_the_usage_apis_figures_and_budgets_their_remaining_fraction(
    console: Console, people: dict[str, dict[str, str]], web: str
) -> None:
    UsageEntry.objects.all().delete()
    limit = {"scope": "tenant", "kind": "tokens", "window": "month", "hard_limit": 10_000}
    put = httpx.put(f"{web}/v1/_limits", headers=people["alice"], json=limit, timeout=30)
    assert put.status_code == 200, put.text
    prompt = "Spend test. MOCK_SCRIPT: " + json.dumps([{"text": "spent"}])
    run = services.run_create(
        principal=ALICE, data=services.RunCreate(agent="scripted", segments=[Segment(text=prompt)])
    )
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    ledger("acme", 2, "mock-script", run_id=run.id, cost="0.125")
    ledger("acme", 1, "gw-model", cost="0.25", n=40)
    ledger("globex", 1, "gw-model", cost="9", n=5000)
    params = {
        "from": (timezone.now() - timedelta(days=3)).isoformat(),
        "to": (timezone.now() + timedelta(hours=1)).isoformat(),
    }

    def rest(group_by: str) -> list[dict[str, Any]]:
        answer = httpx.get(f"{web}/v1/_usage", headers=people["alice"], params={**params, "group_by": group_by})
        groups: list[dict[str, Any]] = answer.json()["groups"]
        return groups

    limits = wait_for(
        lambda: [r for r in httpx.get(f"{web}/v1/_limits", headers=people["alice"]).json()["limits"] if r["used"]],
        timeout=20,
    )
    page = console.sign_in(bearer(people["alice"]))
    page.goto(console.url("/ui/spend/?" + str(httpx.QueryParams(params))))
    tokens, cost = chart(page, "tokens-chart"), chart(page, "cost-chart")
    console.shot(page, "spend")
    by_agent, by_model = rest("day,agent"), rest("day,model")
    assert tokens == expected(by_agent, "agent", "tokens")
    assert cost == expected(by_model, "model", "cost")
    assert {d["label"] for d in tokens["datasets"]} == {"scripted", "(no agent)"}
    assert len(tokens["labels"]) >= 3  # two past days and today's real run
    assert "gw-model" in {d["label"] for d in cost["datasets"]}
    assert 5000 * 1.75 not in [v for d in tokens["datasets"] for v in d["data"]]  # globex's row is not acme's

    [budget] = limits
    remaining = f"{(1 - budget['used'] / budget['hard_limit']) * 100:.1f}%"
    row = page.locator("#budgets tr[data-scope='tenant:'][data-kind=tokens]")
    assert row.locator(".used").inner_text() == str(budget["used"])
    assert row.locator(".percent").inner_text() == remaining

    phone = console.sign_in(bearer(people["alice"]), phone=True)
    phone.goto(console.url("/ui/spend/?" + str(httpx.QueryParams(params))))
    assert chart(phone, "tokens-chart") == tokens
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390  # tables scroll inside their own box
    console.shot(phone, "spend-phone")

    beta = console.sign_in(bearer(people["charlie"]))
    beta.goto(console.url("/ui/spend/?" + str(httpx.QueryParams(params))))
    assert chart(beta, "tokens-chart") == {"labels": [], "datasets": []}
    assert beta.locator("#no-usage").count() == 1 and beta.locator("#no-budgets").count() == 1
