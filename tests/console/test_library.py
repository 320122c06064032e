"""The console's Library (apps/console/views/library.py) in a real browser against the real web
process: create an agent version, fork it, see the lineage and the diff between the two, verify
the deployed content hash, and get REST's refusals (same code and text) for a bad definition and
for a member token that may read but not write."""

from __future__ import annotations

import json

import httpx
import pytest

from apps.substrate.kinds import get_kind
from apps.substrate.models import AgentDef
from tests.console.conftest import Console, bearer

pytestmark = pytest.mark.usefixtures("web", "agents")

V1 = {"provider": "mock", "model": "mock-script", "system_prompt": "You answer in one line.", "tools": []}


def test_create_and_fork_an_agent_version_then_see_lineage_and_diff(
    console: Console, people: dict[str, dict[str, str]]
) -> None:
    page = console.sign_in(bearer(people["alice"]))
    page.click("nav[aria-label=Console] >> text=Library")
    page.wait_for_selector("#create-form")
    page.fill("#id_name", "console-lib")
    page.fill("#id_description", "first cut")
    page.fill("#id_definition", json.dumps(V1))
    page.click("#create-form button[type=submit]")
    page.wait_for_selector("#messages")
    v1 = AgentDef.objects.get(tenant_id="acme", name="console-lib", version=1)
    assert f"created console-lib v1 ({v1.id})" in page.inner_text("#messages")

    page.fill("#id_overlay", json.dumps({"system_prompt": "You answer in two lines.", "max_tokens": 256}))
    page.check("#id_promote")
    page.click("#fork-form button[type=submit]")
    page.wait_for_selector("#messages")
    v2 = AgentDef.objects.get(tenant_id="acme", name="console-lib", version=2)
    assert f"forked v2 ({v2.id}) from {v1.id}" in page.inner_text("#messages")
    assert page.locator(f"#versions tr[data-def='{v2.id}'] .state").inner_text().strip() == "active"
    assert page.locator("#lineage li").evaluate_all("els => els.map(e => e.dataset.def)") == [v2.id, v1.id]

    assert page.input_value("#id_a") == v1.id and page.input_value("#id_b") == v2.id  # newest against its parent
    page.click("#diff-form button[type=submit]")
    page.wait_for_selector("#diff")
    added = page.locator("#diff .add").all_inner_texts()
    removed = page.locator("#diff .del").all_inner_texts()
    console.shot(page, "library-diff")
    assert any('"system_prompt": "You answer in two lines."' in line for line in added)
    assert any('"max_tokens": 256' in line for line in added)
    assert any('"system_prompt": "You answer in one line."' in line for line in removed)

    phone = console.sign_in(bearer(people["alice"]), phone=True)
    phone.goto(page.url)
    phone.wait_for_selector("#diff")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    console.shot(phone, "library-diff-phone")

    page.fill("#id_content_sha256", v2.content_sha256)
    page.click("#verify-form button[type=submit]")
    page.wait_for_selector("#verify-result")
    assert page.inner_text("#verify-result").startswith("Matches the deployed version v2")


def test_a_refused_definition_reads_as_rest_refuses_it(
    console: Console, people: dict[str, dict[str, str]], web: str
) -> None:
    bad = {**V1, "temprature": 0.2}
    rest = httpx.post(
        f"{web}/v1/_agentdef",
        headers=people["alice"],
        json={"op": "create", "name": "console-bad", "overlay": bad},
        timeout=30,
    )
    assert rest.status_code == 422
    page = console.sign_in(bearer(people["alice"]))
    page.goto(console.url("/ui/library/agent/"))
    page.fill("#id_name", "console-bad")
    page.fill("#id_definition", json.dumps(bad))
    with page.expect_response(lambda r: r.request.method == "POST") as info:
        page.click("#create-form button[type=submit]")
    assert info.value.status == 422
    assert page.inner_text("#op-error") == f"{rest.json()['code']}: {rest.json()['error']}"
    assert not get_kind("agent").model.objects.filter(name="console-bad").exists()


def test_a_member_token_reads_the_names_but_versions_and_writes_are_refused_as_rest_refuses_them(
    console: Console, people: dict[str, dict[str, str]], web: str
) -> None:
    page = console.sign_in(bearer(people["bob"]))  # acme, runs:create + runs:read
    page.goto(console.url("/ui/library/agent/"))
    names = httpx.get(f"{web}/v1/_agentdef/names", headers=people["bob"], timeout=30)
    assert names.status_code == 200 and page.locator("#def-names tr[data-name=scripted]").count() == 1
    rest = httpx.post(f"{web}/v1/_agentdef", headers=people["bob"], json={"op": "list", "name": "x"}, timeout=30)
    page.fill("#id_name", "bobs-agent")
    page.fill("#id_definition", json.dumps(V1))
    with page.expect_response(lambda r: r.request.method == "POST") as info:
        page.click("#create-form button[type=submit]")
    assert (info.value.status, rest.status_code) == (403, 403)
    assert page.inner_text("#error-code") == rest.json()["code"] == "insufficient_scope"
    versions = page.goto(console.url("/ui/library/agent/scripted/"))
    assert versions is not None and versions.status == 403
