"""The console's Channels and Memory pages (apps/console/views/channels.py, memory.py) in a real
browser against the real web process: publish to a channel from the page and browse its
messages from a cursor (the same messages REST's peek answers), browse and search memory rows
in scope, and another tenant's session finds neither."""

from __future__ import annotations

import httpx
import pytest

from tests.console.conftest import Console, bearer

pytestmark = pytest.mark.usefixtures("web", "agents")


def test_publish_to_a_channel_and_browse_it_from_a_cursor(
    console: Console, people: dict[str, dict[str, str]], web: str
) -> None:
    alice = people["alice"]
    with httpx.Client(base_url=web, headers=alice, timeout=30) as api:
        assert api.post("/v1/_channels", json={"name": "console-board", "scope": "tenant"}).status_code == 201
        for n in (1, 2):
            api.post("/v1/_channels/console-board/publish", json={"payload": {"n": n}}).raise_for_status()
        page = console.sign_in(bearer(alice))
        page.click("nav[aria-label=Console] >> text=Channels")
        page.wait_for_selector("#channels tr[data-channel=console-board]")
        assert page.inner_text("#channels tr[data-channel=console-board] .count") == "2"
        page.click("#channels >> text=console-board")
        page.fill("#id_payload", '{"n": 3, "from": "the console"}')
        page.click("#publish-form button[type=submit]")
        page.wait_for_selector("#messages")
        peek = api.get("/v1/_channels/console-board/peek").json()["messages"]
        shown = page.locator("#messages-list li").evaluate_all("els => els.map(e => e.dataset.msg)")
        assert shown == [m["id"] for m in peek] and len(shown) == 3
        assert f"published {peek[2]['id']}" in page.inner_text("#messages")
        assert '"from": "the console"' in page.locator(f"li[data-msg='{peek[2]['id']}'] .payload").inner_text()
        console.shot(page, "channel")

        first = page.locator("#messages-list li").first.get_attribute("data-cursor")
        page.click(f"li[data-msg='{peek[0]['id']}'] >> text=browse after this")
        page.wait_for_selector("#from-cursor")
        after = api.get("/v1/_channels/console-board/peek", params={"from_cursor": first}).json()["messages"]
        shown = page.locator("#messages-list li").evaluate_all("els => els.map(e => e.dataset.msg)")
        assert shown == [m["id"] for m in after] == [peek[1]["id"], peek[2]["id"]]

    beta = console.sign_in(bearer(people["charlie"]))
    beta.goto(console.url("/ui/channels/"))
    assert beta.locator("#channels tr[data-channel=console-board]").count() == 0
    theirs = beta.goto(console.url("/ui/channels/console-board/"))
    nowhere = beta.goto(console.url("/ui/channels/no-such-board/"))
    assert theirs is not None and nowhere is not None and theirs.status == nowhere.status == 404
    rest = httpx.get(f"{web}/v1/_channels/console-board/peek", headers=people["charlie"], timeout=30)
    assert (rest.status_code, rest.json()["code"]) == (404, beta.inner_text("#error-code"))


def test_browse_and_search_memory_rows_in_scope(console: Console, people: dict[str, dict[str, str]], web: str) -> None:
    with httpx.Client(base_url=web, headers=people["alice"], timeout=30) as api:
        base = "/v1/_memory/scopes/tenant/-/keys"
        api.put(f"{base}/notes/deploy", json={"value": {"when": "friday"}, "embed": True}).raise_for_status()
        api.put(f"{base}/notes/lunch", json={"value": "noodles", "embed": True}).raise_for_status()
        api.put(f"{base}/other", json={"value": 1}).raise_for_status()
        listed = api.get(base, params={"prefix": "notes/"}).json()["entries"]
        found = api.post("/v1/_memory/search", json={"query": "deploy", "scope": "tenant", "top_k": 1}).json()
    page = console.sign_in(bearer(people["alice"]))
    page.click("nav[aria-label=Console] >> text=Memory")
    page.fill("#id_key_prefix", "notes/")
    page.click("#memory-form button[type=submit]")
    page.wait_for_selector("#memory-rows")
    keys = page.locator("#memory-rows tr[data-key]").evaluate_all("els => els.map(e => e.dataset.key)")
    assert keys == [e["key"] for e in listed] == ["notes/deploy", "notes/lunch"]
    assert '"when": "friday"' in page.inner_text("#memory-rows tr[data-key='notes/deploy'] .value")

    page.fill("#search_query", "deploy")
    page.fill("#search_top_k", "1")
    page.click("#search-form button[type=submit]")
    page.wait_for_selector("#search-hits")
    hits = page.locator("#search-hits li[data-key]").evaluate_all("els => els.map(e => e.dataset.key)")
    console.shot(page, "memory")
    assert hits == [e["key"] for e in found["entries"]] and len(hits) == 1

    beta = console.sign_in(bearer(people["charlie"]))
    beta.goto(console.url("/ui/memory/?scope=tenant&key_prefix=notes/&limit=100"))
    assert beta.locator("#no-rows").count() == 1
    beta.goto(console.url("/ui/memory/search?query=deploy&scope=tenant&top_k=5"))
    assert beta.locator("#search-hits li[data-key]").count() == 0
