"""The data-lifecycle RPCs through loomcycle's official client (issue 38): DeleteRunTree,
ErasureReport / ErasureExecute and RetentionOverride, each the HTTP route's service."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from loomcycle import LoomcycleClient
from loomcycle import errors as lc

from apps.memory.models import MemoryEntry
from apps.runs.models import Run, RunStatus
from tests.conftest import wait_status

pytestmark = pytest.mark.usefixtures("agents", "stack")


def _token(people: Any, who: str) -> str:
    return str(people[who]["authorization"].removeprefix("Bearer "))


def test_delete_run_tree_erasure_and_overrides_over_grpc(grpc_target: str, people: Any, http: Any) -> None:
    resp = http.post("/v1/runs", json={"agent": "spawner", "prompt": "hi", "background": True}, headers=people["alice"])
    run_id = resp.json()["run_id"]
    wait_status(run_id, RunStatus.COMPLETED)
    MemoryEntry.objects.create(tenant_id="acme", scope="user", scope_id="dora", key="k", value={"v": 1})

    async def main() -> None:
        async with LoomcycleClient(target=grpc_target, auth_token=_token(people, "charlie")) as beta:
            assert (await beta.delete_run_tree(run_id))["deleted_runs"] == 0  # another tenant's: as missing
        async with LoomcycleClient(target=grpc_target, auth_token=_token(people, "alice")) as acme:
            deleted = await acme.delete_run_tree(run_id)
            assert deleted["deleted_runs"] == 2 and deleted["counts"]["runs.RunEvent"] > 0
            assert "gateway.UsageEntry" in deleted["kept"]
            assert (await acme.delete_run_tree(run_id))["deleted_runs"] == 0  # a repeat is safe

            report = await acme.erasure_report("dora")
            assert report["tenant"] == "acme" and report["tier1_covered"]["counts"]["memory.MemoryEntry"] == 1
            dry = await acme.erasure_execute("dora")
            assert dry["dry_run"] is True and dry["deleted"] == {}
            with pytest.raises(lc.InvalidArgumentError):
                await acme.erasure_execute("dora", dry_run=False, confirm="someone-else")
            done = await acme.erasure_execute("dora", dry_run=False, confirm="dora")
            assert done["deleted"]["memory.MemoryEntry"] == 1 and "gateway.UsageEntry" in done["retained"]

            until = timezone.now() + timedelta(hours=2)
            entry = await acme.set_retention_override(agent="echo", until=until)
            assert (entry["tenant"], entry["agent"], entry["set_by"]) == ("acme", "echo", "alice")
            assert [o["agent"] for o in await acme.list_retention_overrides()] == ["echo"]
            with pytest.raises(lc.InvalidArgumentError):
                await acme.set_retention_override(agent="echo", until=timezone.now() + timedelta(days=2))
            assert await acme.clear_retention_override(agent="echo") is True
            assert await acme.list_retention_overrides() == []

    asyncio.run(main())
    assert not Run.objects.filter(id=run_id).exists()
    assert not MemoryEntry.objects.filter(scope_id="dora").exists()
