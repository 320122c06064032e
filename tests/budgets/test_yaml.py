"""The operator's default budgets in yaml (issue 37): `limits:` entries are loaded at
boot (source yaml), a limit written through the API keeps winning over a yaml
default of the same key, an entry dropped from the yaml is removed, and a bad
entry stops the load naming it."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.budgets import services
from apps.budgets.errors import InvalidLimit
from apps.budgets.models import TokenLimit
from loomcycle_project.bootstrap import load_yaml_config

pytestmark = pytest.mark.usefixtures("transactional_db")

TENANT = {"scope": "tenant", "tenant_id": "acme", "hard_limit": 1000, "soft_limit": 800}
AGENT = {
    "scope": "agent",
    "tenant_id": "acme",
    "scope_id": "echo",
    "kind": "cost_usd",
    "window": "day",
    "hard_limit": 2.5,
}


def test_yaml_limits_are_defaults_the_api_overrides() -> None:
    TokenLimit.objects.all().delete()
    assert services.limits_sync_yaml(config={"limits": [TENANT, AGENT]}) == 2
    row = TokenLimit.objects.get(scope="agent")
    assert row.source == "yaml" and row.hard_limit == Decimal("2.5") and row.window == "day"
    spec = services.LimitSpec(tenant_id="acme", scope="tenant", hard_limit=Decimal(5))
    services.limit_put(spec=spec, updated_by="ops")  # an operator's own write of the same key
    services.limits_sync_yaml(config={"limits": [TENANT]})  # next boot: the agent entry is gone from the yaml
    assert TokenLimit.objects.get(scope="tenant").hard_limit == 5  # the API's value stands
    assert not TokenLimit.objects.filter(scope="agent").exists()


def test_a_bad_yaml_limit_stops_the_load_naming_its_index() -> None:
    with pytest.raises(InvalidLimit) as bad:
        load_yaml_config({"limits": [TENANT, {"scope": "user", "hard_limit": 1}]})
    assert "limits[1]" in bad.value.message and "scope_id" in bad.value.message
