"""`/v1/_limits` and `/v1/_usage` over real HTTP (issue 37): loomcycle's shape,
tenant confinement (a tenant sees and writes only its own; the operator-global
limit is the operator's), usage totals equal to the ledger per group, CSV."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from decimal import Decimal

import httpx
import pytest
from django.db.models import Sum
from django.utils import timezone

from apps.budgets.models import TokenLimit
from apps.gateway.models import UsageEntry, UsageSource
from apps.substrate import tokens

pytestmark = pytest.mark.usefixtures("agents", "stack")


@pytest.fixture(autouse=True)
def _clean(agents: None) -> Iterator[None]:
    TokenLimit.objects.all().delete()
    UsageEntry.objects.all().delete()
    yield
    TokenLimit.objects.all().delete()


def bearer(tenant: str, scopes: list[str]) -> dict[str, str]:
    token = tokens.token_create(
        name=f"{tenant}-{len(scopes)}-b", tenant_id=tenant, subject=f"{tenant}-admin", scopes=scopes
    )
    return {"Authorization": f"Bearer {token['token']}"}


def ledger(tenant: str, user: str, model: str, tokens_in: int, cost: str | None) -> None:
    UsageEntry.objects.create(
        created_at=timezone.now(),
        tenant_id=tenant,
        user_id=user,
        source=UsageSource.GATEWAY,
        provider="p",
        model=model,
        input_tokens=tokens_in,
        output_tokens=1,
        cost_usd=None if cost is None else Decimal(cost),
    )


def test_a_tenant_manages_only_its_own_limits(http: httpx.Client) -> None:
    acme, other = bearer("acme", ["substrate:tenant"]), bearer("globex", ["substrate:tenant"])
    put = http.put("/v1/_limits", headers=acme, json={"scope": "user", "scope_id": "u1", "hard_limit": 500})
    assert put.status_code == 200, put.text
    [row] = put.json()["limits"]
    assert row["tenant_id"] == "acme" and row["hard_limit"] == 500 and row["used"] == 0 and row["window"] == "month"
    assert row["updated_by"] == "acme-admin"
    assert http.get("/v1/_limits", headers=other).json() == {"limits": []}
    foreign = http.put("/v1/_limits", headers=other, json={"tenant_id": "acme", "scope": "tenant", "hard_limit": 1})
    assert foreign.status_code == 403 and foreign.json()["code"] == "limit_forbidden"
    operator = http.put("/v1/_limits", headers=acme, json={"scope": "operator", "hard_limit": 1})
    assert operator.status_code == 403
    bad = http.put(
        "/v1/_limits", headers=acme, json={"scope": "user", "scope_id": "u1", "soft_limit": 9, "hard_limit": 1}
    )
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_limit"
    gone = http.delete("/v1/_limits", headers=acme, params={"scope": "user", "scope_id": "u1"})
    assert gone.json() == {"deleted": 1} and http.get("/v1/_limits", headers=acme).json() == {"limits": []}


def test_usage_totals_equal_the_ledger_per_group_within_the_tenant(http: httpx.Client) -> None:
    ledger("acme", "u1", "m-a", 10, "0.5")
    ledger("acme", "u1", "m-b", 20, None)
    ledger("acme", "u2", "m-a", 30, "0.25")
    ledger("globex", "u1", "m-a", 1000, "9")
    acme = bearer("acme", ["substrate:tenant"])
    body = http.get("/v1/_usage", headers=acme, params={"group_by": "user,model"}).json()
    groups = {(g["user"], g["model"]): g for g in body["groups"]}
    assert set(groups) == {("u1", "m-a"), ("u1", "m-b"), ("u2", "m-a")}  # globex's row is not acme's to see
    assert groups[("u1", "m-b")]["cost"] == "unpriced" and groups[("u1", "m-b")]["unpriced_calls"] == 1
    want = UsageEntry.objects.filter(tenant_id="acme").aggregate(i=Sum("input_tokens"), c=Sum("cost_usd"))
    assert body["total"]["input_tokens"] == want["i"] and Decimal(body["total"]["cost_usd"]) == want["c"]
    text = http.get("/v1/_usage", headers=acme, params={"group_by": "user", "format": "csv"}).text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {r["user"]: int(r["input_tokens"]) for r in rows} == {"u1": 30, "u2": 30}
    admin = bearer("ops", ["substrate:admin"])
    everyone = http.get("/v1/_usage", headers=admin, params={"group_by": "tenant"}).json()
    assert {g["tenant"]: g["input_tokens"] for g in everyone["groups"]} == {"acme": 60, "globex": 1000}
    bad = http.get("/v1/_usage", headers=acme, params={"group_by": "planet"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_group_by"
