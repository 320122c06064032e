"""The admin (issue 37): the usage page reads the report the API and the CLI read,
and a limit saved in the admin goes through the service (checked, and a raise
wakes the runs it deferred)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from apps.budgets import selectors
from apps.budgets.models import TokenLimit
from apps.gateway.models import UsageEntry, UsageSource
from apps.runs.models import RunStatus
from tests.conftest import wait_status
from tests.factories.runs import start

pytestmark = pytest.mark.usefixtures("agents", "stack")


@pytest.fixture
def root() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def test_the_usage_page_shows_the_api_report(root: Client) -> None:
    UsageEntry.objects.all().delete()
    for tenant, n in (("acme", 7), ("globex", 11)):
        UsageEntry.objects.create(
            created_at=timezone.now(), tenant_id=tenant, source=UsageSource.GATEWAY, provider="p", model="m",
            input_tokens=n, output_tokens=1,
        )  # fmt: skip
    page = root.get("/admin/budgets/tokenlimit/usage/", {"by": "tenant", "days": "7"})
    assert page.status_code == 200
    rows = selectors.usage_report(
        tenant_id=None, group_by=["tenant"], since=timezone.now().replace(year=2000), until=timezone.now()
    )
    for row in rows:
        assert (
            f"<td>{row.key['tenant']}</td><td>{row.calls}</td><td>{row.sums['input_tokens']}</td>"
            in page.content.decode()
        )
    assert root.get("/admin/budgets/tokenlimit/usage/", {"by": "planet"}).status_code == 400


def test_raising_a_limit_in_the_admin_wakes_its_deferred_run(root: Client) -> None:
    TokenLimit.objects.all().delete()
    form = {"tenant_id": "", "scope": "user", "scope_id": "u-admin", "kind": "tokens", "window": "month",
            "window_hours": "0", "hard_limit": "0", "on_exceed": "defer"}  # fmt: skip
    assert root.post("/admin/budgets/tokenlimit/add/", form).status_code == 302
    run = start("echo", user_id="u-admin")
    assert run.status == RunStatus.WAITING_BUDGET
    limit = TokenLimit.objects.get(scope_id="u-admin")
    assert limit.updated_by == "admin:root"
    changed = root.post(f"/admin/budgets/tokenlimit/{limit.pk}/change/", {**form, "hard_limit": "100000"})
    assert changed.status_code == 302 and TokenLimit.objects.get(pk=limit.pk).hard_limit == Decimal(100000)
    assert wait_status(run.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=20).status == RunStatus.COMPLETED
    TokenLimit.objects.all().delete()
