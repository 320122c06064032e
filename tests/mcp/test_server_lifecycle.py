"""loomcycle's `erasure` MCP tool (issue 38, SPEC 2.12) through the official SDK client over
`/v1/_mcp`: the same report as `GET /v1/_erasure`, an execute that is a dry run unless confirmed,
and the caller's tenant only (a namesake in another tenant keeps everything)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from mcp.client import Client

from apps.memory.models import MemoryEntry
from apps.memory.services import Slot, memory_set
from apps.runs.models import Run
from tests.factories.mcp import call, over_http

pytestmark = pytest.mark.usefixtures("agents", "stack")

PERSON = "u-mcp-erase-3f"
Reply = tuple[bool, dict[str, Any]]


def _held() -> None:
    for tenant in ("acme", "beta"):
        memory_set(slot=Slot(tenant, "user", PERSON), key="profile", value={"note": f"{tenant} likes tea"})


def test_erasure_reports_as_rest_and_erases_only_when_confirmed_in_the_callers_tenant(
    web: str, http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    _held()
    rest = http.get("/v1/_erasure", params={"subject": PERSON}, headers=people["alice"]).json()

    async def work(client: Client) -> tuple[set[str], list[Reply]]:
        listed = {t.name for t in (await client.list_tools()).tools}
        replies = [
            await call(client, "erasure", {"subject": PERSON}),
            await call(client, "erasure", {"subject": PERSON, "op": "execute"}),  # dry_run defaults true
            await call(client, "erasure", {"subject": PERSON, "op": "execute", "dry_run": False, "confirm": "x"}),
            await call(client, "erasure", {"subject": PERSON, "tenant": "beta"}),  # no argument names a tenant
            await call(client, "erasure", {"subject": "no spaces"}),
        ]
        return listed, replies

    async def execute(client: Client) -> Reply:
        body = {"subject": PERSON, "op": "execute", "dry_run": False, "confirm": PERSON}
        return await call(client, "erasure", body)

    listed, (report, dry, unconfirmed, tenant, bad) = over_http(web, people["alice"], work)
    assert MemoryEntry.objects.filter(tenant_id="acme", scope_id=PERSON).count() == 1  # nothing erased yet
    done = over_http(web, people["alice"], execute)
    assert "erasure" in listed
    assert not report[0] and report[1] == {k: rest[k] for k in report[1]}  # the REST report (its schema pads it)
    assert report[1]["tier1_covered"]["counts"]["memory.MemoryEntry"] == 1
    assert not dry[0] and dry[1]["dry_run"] is True and dry[1]["tier1_covered"] == rest["tier1_covered"]
    assert unconfirmed[0] and (unconfirmed[1]["code"], unconfirmed[1]["status"]) == ("confirm_mismatch", 400)
    assert tenant[0] and tenant[1]["code"] == "invalid_body"
    assert bad[0] and bad[1]["code"] == "invalid_subject"
    assert not done[0] and done[1]["status"] == "done" and done[1]["deleted"]["memory.MemoryEntry"] == 1
    assert not MemoryEntry.objects.filter(tenant_id="acme", scope_id=PERSON).exists()
    assert MemoryEntry.objects.filter(tenant_id="beta", scope_id=PERSON).count() == 1  # the namesake's stays
    assert not Run.objects.filter(tenant_id="acme", user_id=PERSON).exists()
