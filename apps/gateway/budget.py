"""A gateway call's budget (issue 37, apps.core.spend): a hold before the provider
is called, settled with the call's reported usage when it finishes. Over a hard
limit the call is refused with 429 `token_limit_exceeded` in OpenAI's error shape
(`{"error": {"message", "type", "code", "param"}}`), which the OpenAI SDKs raise
as a RateLimitError. A limit that defers cannot park a caller's HTTP request: the
gateway refuses it the same way."""

from __future__ import annotations

from typing import Any

from apps.core import spend
from apps.core.http import db_call
from apps.gateway.pricing import cost_usd
from apps.gateway.providers import Usage


class GatewayTokenLimitExceeded(spend.TokenLimitExceeded):
    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": "insufficient_quota", "code": self.code, "param": None}
        return {"error": {**error, **self.details}}


async def hold(*, request_id: str, tenant_id: str, user_id: str) -> bool:
    """Reserve on the caller's budgets; True when a settle is owed. Raises 429 over a hard limit."""
    g = spend.guard()
    if g is None:
        return False
    verdict = await db_call(g.hold)(key=f"gw:{request_id}", step=None, spender=spend.Spender(tenant_id, user_id))
    if verdict.hard is not None:
        hard = verdict.hard
        raise GatewayTokenLimitExceeded(hard.message, details=hard.details(), headers=spend.retry_after(hard))
    return verdict.held


async def settle(*, request_id: str, usage: Usage | None) -> None:
    g = spend.guard()
    if g is None:
        return
    counted = usage.as_dict() if usage is not None else {}
    cost = cost_usd(usage.provider, usage.model, usage) if usage is not None else None
    price = None if cost is None else str(cost)
    await db_call(g.settle_call)(key=f"gw:{request_id}", usage=counted, cost_usd=price)
