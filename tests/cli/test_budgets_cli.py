"""`loomcycle usage` and `loomcycle limits` (issue 37), as a subprocess against the
running stack: the usage report grouped by agent over the last 7 days equals the
ledger; limits set, listed and removed."""

from __future__ import annotations

import csv
import io

import pytest
from django.db.models import Sum

from apps.budgets.models import TokenLimit
from apps.gateway.models import UsageEntry
from apps.runs.models import RunStatus
from tests.cli.conftest import Web, cli, json_lines
from tests.conftest import wait_status
from tests.factories.runs import start

pytestmark = pytest.mark.usefixtures("agents", "stack")


def test_usage_by_agent_since_7d_equals_the_ledger(web_proc: Web) -> None:
    run = start("echo", user_id="u-cli")
    assert wait_status(run.id, RunStatus.COMPLETED).status == RunStatus.COMPLETED
    done = cli(web_proc, "usage", "--by", "agent", "--since", "7d", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["agent"]: r for r in json_lines(done.stdout)}
    run_ids = [run.id]
    want = UsageEntry.objects.filter(run_id__in=run_ids).aggregate(i=Sum("input_tokens"))["i"]
    assert rows["echo"]["input_tokens"] >= want > 0
    table = cli(web_proc, "usage", "--by", "agent,model", "--since", "7d")
    assert table.returncode == 0 and "echo" in table.stdout and "TOTAL" in table.stdout
    as_csv = cli(web_proc, "usage", "--by", "agent", "--since", "7d", "--csv")
    assert "echo" in {r["agent"] for r in csv.DictReader(io.StringIO(as_csv.stdout))}
    bad = cli(web_proc, "usage", "--since", "last tuesday")
    assert bad.returncode == 4 and "invalid_since" in bad.stderr


def test_limits_set_list_and_remove(web_proc: Web) -> None:
    TokenLimit.objects.filter(scope_id="u-cli-limit").delete()
    done = cli(web_proc, "limits", "set", "user", "u-cli-limit", "--hard", "500", "--on-exceed", "defer")
    assert done.returncode == 0, done.stderr
    [row] = json_lines(done.stdout)
    assert row["hard_limit"] == 500 and row["on_exceed"] == "defer" and row["used"] == 0
    listed = json_lines(cli(web_proc, "limits", "list", "--json").stdout)
    assert any(r["scope_id"] == "u-cli-limit" for r in listed)
    assert cli(web_proc, "limits", "rm", "user", "u-cli-limit").stdout.strip() == "deleted 1"
    assert not TokenLimit.objects.filter(scope_id="u-cli-limit").exists()
