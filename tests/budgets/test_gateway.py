"""Gateway calls spend the caller's budgets (issue 37): counted from their
reported usage, and refused over a hard limit with 429 `token_limit_exceeded`
in OpenAI's error shape, on /v1/chat/completions, /v1/_llm/chat and /v1/embeddings."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import httpx
import pytest
from django.db.models import Sum

from apps.budgets import services
from apps.budgets.models import LimitHold, LimitWindow, TokenLimit
from apps.gateway.models import UsageEntry
from tests.conftest import wait_for

pytestmark = pytest.mark.usefixtures("transactional_db")

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _no_limits(transactional_db: None) -> Iterator[None]:
    TokenLimit.objects.all().delete()
    yield
    TokenLimit.objects.all().delete()


def chat(http: httpx.Client, user: str) -> httpx.Response:
    body = {"messages": HI, "loomcycle_provider": "mock", "model": "mock-generic", "user": user}
    return http.post("/v1/chat/completions", json=body)


def test_gateway_calls_are_counted_and_refused_in_openais_shape_once_spent(http: httpx.Client) -> None:
    spec = services.LimitSpec(tenant_id="", scope="user", scope_id="gw-u", hard_limit=Decimal(1))
    services.limit_put(spec=spec, updated_by="test")
    assert chat(http, "gw-u").status_code == 200  # the budget is unspent: the call passes
    window = LimitWindow.objects.get(limit__scope_id="gw-u")
    ledger = wait_for(
        lambda: (
            UsageEntry.objects.filter(user_id="gw-u").aggregate(i=Sum("input_tokens"), o=Sum("output_tokens"))
            if UsageEntry.objects.filter(user_id="gw-u").exists()
            else None
        )
    )
    window.refresh_from_db()
    assert window.used == ledger["i"] + ledger["o"] and window.held == 0 and not LimitHold.objects.exists()
    refused = chat(http, "gw-u")
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "token_limit_exceeded" and error["type"] == "insufficient_quota"
    assert error["scope"] == "user" and error["scope_id"] == "gw-u" and "budget reached" in error["message"]
    native = http.post(
        "/v1/_llm/chat", json={"messages": HI, "provider": "mock", "model": "mock-generic", "user_id": "gw-u"}
    )
    assert native.status_code == 429 and native.json()["error"]["code"] == "token_limit_exceeded"
    embed = http.post("/v1/embeddings", json={"input": ["x"], "user": "gw-u"})
    assert embed.status_code == 429 and embed.json()["error"]["code"] == "token_limit_exceeded"
    assert chat(http, "someone-else").status_code == 200
