"""The budget RPCs through loomcycle's official client (issue 37): TokenLimit (list / set /
delete) and UsageReport, the services and tenant rule of /v1/_limits and /v1/_usage."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import grpc
import pytest
from django.utils import timezone
from loomcycle import LoomcycleClient
from loomcycle import errors as lc

from apps.budgets.models import Kind, OnExceed, TokenLimit, Window
from apps.gateway.models import UsageEntry, UsageSource
from apps.substrate import tokens

pytestmark = pytest.mark.usefixtures("agents", "stack")


@pytest.fixture(autouse=True)
def _clean(agents: None) -> Iterator[None]:
    TokenLimit.objects.all().delete()
    UsageEntry.objects.all().delete()
    yield
    TokenLimit.objects.all().delete()
    UsageEntry.objects.all().delete()


def _token(people: Any, who: str) -> str:
    return str(people[who]["authorization"].removeprefix("Bearer "))


def _spend(tenant: str, user: str, model: str, tokens_in: int, cost: str | None) -> None:
    UsageEntry.objects.create(
        created_at=timezone.now(),
        tenant_id=tenant,
        user_id=user,
        source=UsageSource.GATEWAY,
        provider="p",
        model=model,
        input_tokens=tokens_in,
        output_tokens=2,
        cache_read_input_tokens=3,
        cost_usd=None if cost is None else Decimal(cost),
    )


async def _denied(call: Awaitable[Any]) -> None:
    """PERMISSION_DENIED (the official client's plain LoomcycleError carrying the code)."""
    with pytest.raises(lc.LoomcycleError) as info:
        await call
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_token_limits_over_grpc_are_the_rest_limits_within_the_tenant(grpc_target: str, people: Any) -> None:
    TokenLimit.objects.create(
        tenant_id="acme",
        scope="tenant",
        kind=Kind.COST,
        window=Window.DAY,
        hard_limit=Decimal("1.5"),
        updated_at=timezone.now(),
    )

    async def main() -> None:
        async with LoomcycleClient(target=grpc_target, auth_token=_token(people, "alice")) as acme:
            row = await acme.set_token_limit(scope="user", scope_id="dora", hard_limit=500)
            assert (row["tenant_id"], row["scope_id"], row["hard_limit"], row["soft_limit"]) == (
                "acme",
                "dora",
                500,
                None,
            )
            assert row["used"] == 0 and row["updated_by"] == "alice"
            assert [r["scope_id"] for r in await acme.list_token_limits(tenant="beta")] == ["dora"]  # own tenant only
            await _denied(acme.set_token_limit(scope="operator", hard_limit=1))
            await _denied(acme.set_token_limit(scope="user", scope_id="x", tenant="beta", hard_limit=1))
            with pytest.raises(lc.InvalidArgumentError):
                await acme.set_token_limit(scope="user", scope_id="x", soft_limit=9, hard_limit=1)
        async with LoomcycleClient(target=grpc_target, auth_token=_token(people, "bob")) as member:
            await _denied(
                member.set_token_limit(scope="user", scope_id="bob", hard_limit=1)
            )  # writes are not member-accessible, as PUT /v1/_limits
        async with LoomcycleClient(target=grpc_target, auth_token=_token(people, "charlie")) as beta:
            assert await beta.list_token_limits() == []
        async with LoomcycleClient(target=grpc_target, auth_token=_token(people, "charlie")) as beta:
            await _denied(
                beta.delete_token_limit(scope="user", scope_id="dora", tenant="acme")
            )  # another tenant's limit: 403, as DELETE /v1/_limits
        async with LoomcycleClient(target=grpc_target, auth_token=_token(people, "alice")) as acme:
            assert [r["hard_limit"] for r in await acme.list_token_limits()] == [500]
            await acme.delete_token_limit(scope="user", scope_id="dora")
            assert await acme.list_token_limits() == []

    asyncio.run(main())
    # the cost limit of a REST-only shape is neither listed nor removed by the loomcycle-shaped RPC
    assert TokenLimit.objects.filter(tenant_id="acme", kind=Kind.COST).exists()
    assert not TokenLimit.objects.filter(scope_id="dora").exists()


def test_a_set_over_grpc_keeps_the_limits_deferral(grpc_target: str, people: Any) -> None:
    TokenLimit.objects.create(
        tenant_id="acme", scope="tenant", hard_limit=10, on_exceed=OnExceed.DEFER, updated_at=timezone.now()
    )

    async def main() -> None:
        async with LoomcycleClient(target=grpc_target, auth_token=_token(people, "alice")) as acme:
            assert (await acme.set_token_limit(scope="tenant", soft_limit=5, hard_limit=20))["hard_limit"] == 20

    asyncio.run(main())
    row = TokenLimit.objects.get(tenant_id="acme", scope="tenant")
    assert (row.hard_limit, row.soft_limit, row.on_exceed) == (20, 5, OnExceed.DEFER)


def test_usage_report_over_grpc_equals_the_ledger_within_the_tenant(grpc_target: str, people: Any) -> None:
    _spend("acme", "dora", "m1", 10, "0.5")
    _spend("acme", "dora", "m1", 20, "0.25")
    _spend("acme", "eve", "m2", 7, None)
    _spend("beta", "zed", "m1", 1000, "9")
    ops = tokens.token_create(name="ops-usage", tenant_id="ops")["token"]

    async def main() -> None:
        async with LoomcycleClient(target=grpc_target, auth_token=_token(people, "alice")) as acme:
            report = await acme.usage_report(group_by=["user", "model"], tenant="beta")  # focus ignored
            rows = {(r["user_id"], r["model"]): r for r in report["rows"]}
            assert report["group_by"] == ["user", "model"] and set(rows) == {("dora", "m1"), ("eve", "m2")}
            dora = rows["dora", "m1"]
            assert (dora["input_tokens"], dora["output_tokens"], dora["cache_read_tokens"]) == (30, 4, 6)
            assert (dora["call_count"], dora["cost"], dora["currency"], dora["unpriced_calls"]) == (2, 0.75, "USD", 0)
            assert (rows["eve", "m2"]["unpriced_calls"], rows["eve", "m2"]["cost"]) == (1, 0.0)
            with pytest.raises(lc.InvalidArgumentError):
                await acme.usage_report(group_by=["source"])
            with pytest.raises(lc.InvalidArgumentError):
                await acme.usage_report(from_time="yesterday")
            later = (timezone.now() + timedelta(hours=1)).isoformat()
            assert (await acme.usage_report(from_time=later))["rows"] == []
        async with LoomcycleClient(target=grpc_target, auth_token=ops) as operator:
            every = (await operator.usage_report())["rows"]
            assert {r["tenant_id"]: r["input_tokens"] for r in every} == {"acme": 37, "beta": 1000}
            focused = (await operator.usage_report(tenant="beta"))["rows"]
            assert [(r["tenant_id"], r["call_count"]) for r in focused] == [("beta", 1)]

    asyncio.run(main())
