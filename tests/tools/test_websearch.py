"""WebSearch (issue 40) called as the engine calls it (a ToolContext, in this process)
against loopback servers speaking SearXNG's and Brave's JSON APIs: the hits as
`search_result` untrusted blocks, the fallback order (operator's and agent's), the
`web_search_filter` host narrowing, the SSRF guard on every backend call, and each
refusal."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from apps.core.errors import Invalid
from apps.runs.models import RunEvent
from apps.substrate.services import agent_def_sync_static
from apps.tools.search_backends import search_config
from apps.tools.websearch import NOT_CONFIGURED, websearch_execute
from tests.tools.conftest import tool_context

pytestmark = pytest.mark.usefixtures("net")

SEARXNG_HITS = {
    "results": [
        {"title": "Python 3 < 4", "url": "https://docs.python.org/3/", "content": "The <b>official</b> docs."},
        {"title": "Elsewhere", "url": "https://blog.example.net/p", "content": "A post."},
    ]
}
BRAVE_HITS = {
    "web": {
        "results": [
            {"title": "<strong>Brave</strong> hit", "url": "https://b.example.com/x", "description": "From brave."}
        ]
    }
}


@pytest.fixture
def brave() -> Iterator[HTTPServer]:
    server = HTTPServer(host="127.0.0.1", port=0)
    server.start()
    try:
        yield server
    finally:
        server.clear()
        server.stop()


def configure(settings: Any, tmp_path: Path, block: dict[str, Any], *, brave_key: str | None = "bk-secret") -> None:
    """A yaml with `block` as its search blocks, and the Brave key (or none)."""
    path = tmp_path / "search.yaml"
    path.write_text(json.dumps(block))
    keys = {**settings.LOOMCYCLE.provider_keys, "BRAVE_API_KEY": brave_key}
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, config_files=(str(path),), config_dir="", provider_keys=keys
    )


def searxng_at(server: HTTPServer) -> dict[str, Any]:
    return {"base_url": server.url_for("/").rstrip("/")}


def brave_at(server: HTTPServer) -> dict[str, Any]:
    return {"base_url": server.url_for("/res/v1/web/search")}


@pytest.mark.django_db
def test_searxng_hits_come_back_as_search_result_blocks(httpserver: HTTPServer, settings: Any, tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []

    def answer(request: Request) -> Response:
        seen.append(dict(request.args))
        return Response(json.dumps(SEARXNG_HITS), content_type="application/json")

    httpserver.expect_request("/search").respond_with_handler(answer)
    configure(settings, tmp_path, {"search_providers": {"searxng": searxng_at(httpserver)}})
    result = websearch_execute(tool_context(), {"query": " python docs ", "recency": "week", "max_results": 1})
    assert not result.is_error, result.text
    assert seen == [{"q": "python docs", "format": "json", "time_range": "week"}]
    assert result.text == (
        "<search_result>\n[1] Python 3 &lt; 4 — https://docs.python.org/3/\nThe official docs.\n</search_result>"
    )  # tags stripped from the snippet, `<` escaped: the text cannot close its block


@pytest.mark.django_db
def test_brave_is_called_with_its_key_count_and_freshness(brave: HTTPServer, settings: Any, tmp_path: Path) -> None:
    seen: list[tuple[str, dict[str, str]]] = []

    def answer(request: Request) -> Response:
        seen.append((request.headers.get("X-Subscription-Token", ""), dict(request.args)))
        return Response(json.dumps(BRAVE_HITS), content_type="application/json")

    brave.expect_request("/res/v1/web/search").respond_with_handler(answer)
    configure(settings, tmp_path, {"search_providers": {"brave": brave_at(brave)}})
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_private_host_allowlist=("127.0.0.1",))
    result = websearch_execute(tool_context(), {"query": "q", "max_results": 80, "recency": "day"})
    assert not result.is_error, result.text
    assert seen == [("bk-secret", {"q": "q", "count": "20", "freshness": "pd"})]  # 80 -> 25, Brave's own cap 20
    assert result.text == "<search_result>\n[1] Brave hit — https://b.example.com/x\nFrom brave.\n</search_result>"
    assert "bk-secret" not in result.text


@pytest.mark.django_db
def test_a_failing_backend_falls_over_to_the_next_and_an_agent_order_wins(
    httpserver: HTTPServer, brave: HTTPServer, settings: Any, tmp_path: Path
) -> None:
    httpserver.expect_request("/search").respond_with_data("down", status=503)
    brave.expect_request("/res/v1/web/search").respond_with_json(BRAVE_HITS)
    block = {"searxng": searxng_at(httpserver), "brave": brave_at(brave)}
    configure(settings, tmp_path, {"search_providers": block, "search_priority": ["searxng", "brave"]})
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_private_host_allowlist=("localhost", "127.0.0.1"))
    result = websearch_execute(tool_context(), {"query": "q"})
    assert not result.is_error and "Brave hit" in result.text
    assert len(httpserver.log) == 1 and len(brave.log) == 1  # searxng tried first, then brave

    agent = agent_def_sync_static(
        name="ws-agent", raw={"provider": "mock", "model": "m", "tools": ["WebSearch"], "search_providers": ["brave"]}
    )
    ctx = dataclasses.replace(tool_context(), agent_def_id=agent.id)
    assert "Brave hit" in websearch_execute(ctx, {"query": "q"}).text
    assert len(httpserver.log) == 1 and len(brave.log) == 2  # the agent's list: brave only

    brave.clear()
    brave.expect_request("/res/v1/web/search").respond_with_data("no", status=500)
    failed = websearch_execute(tool_context(), {"query": "q"})
    assert failed.is_error and failed.text == "WebSearch: every search backend failed; last: brave: status 500"


@pytest.mark.django_db
def test_web_search_filter_drops_hits_outside_the_narrowed_hosts_unless_keep(
    httpserver: HTTPServer, settings: Any, tmp_path: Path
) -> None:
    httpserver.expect_request("/search").respond_with_json(SEARXNG_HITS)
    configure(settings, tmp_path, {"search_providers": {"searxng": searxng_at(httpserver)}})
    narrowed = dataclasses.replace(tool_context(allowed_hosts=("python.org",)), web_search_filter="drop")
    dropped = websearch_execute(narrowed, {"query": "q"})
    assert "docs.python.org" in dropped.text and "blog.example.net" not in dropped.text
    kept = websearch_execute(dataclasses.replace(narrowed, web_search_filter="keep"), {"query": "q"})
    assert "blog.example.net" in kept.text
    unnarrowed = websearch_execute(tool_context(allowed_hosts=()), {"query": "q"})  # caller did not narrow
    assert "blog.example.net" in unnarrowed.text
    nothing = websearch_execute(dataclasses.replace(narrowed, allowed_hosts=()), {"query": "q"})
    assert (nothing.is_error, nothing.text) == (False, "no results")


@pytest.mark.django_db
def test_every_backend_call_goes_through_the_ssrf_guard(settings: Any, tmp_path: Path) -> None:
    configure(settings, tmp_path, {"search_providers": {"searxng": {"base_url": "http://10.0.0.7:8080"}}})
    result = websearch_execute(tool_context(), {"query": "q"})
    assert result.is_error and result.text.startswith("WebSearch: every search backend failed; last: searxng: refused:")


@pytest.mark.django_db
def test_refusals_say_what_to_fix(settings: Any, tmp_path: Path) -> None:
    configure(settings, tmp_path, {}, brave_key=None)
    assert websearch_execute(tool_context(), {"query": "q"}).text == NOT_CONFIGURED
    configure(settings, tmp_path, {"search_providers": {"brave": {}}}, brave_key=None)
    no_key = websearch_execute(tool_context(), {"query": "q"})
    assert no_key.is_error and "BRAVE_API_KEY" in no_key.text
    configure(settings, tmp_path, {}, brave_key="k")
    assert list(search_config({}).backends) == ["brave"]  # a Brave key alone enables Brave (loomcycle's default)
    for bad, why in (
        ({}, "query is required"),
        ({"query": "q", "max_results": 0}, "max_results"),
        ({"query": "q", "recency": "decade"}, "recency must be one of day, week, month, year"),
        ({"query": "q", "site": "x"}, "unknown fields ['site']"),
    ):
        refused = websearch_execute(tool_context(), bad)
        assert refused.is_error and why in refused.text, (bad, refused.text)


@pytest.mark.parametrize(
    ("block", "why"),
    [
        ({"search_providers": {"google": {}}}, "unknown provider 'google'"),
        ({"search_providers": {"searxng": {}}}, "base_url is required"),
        ({"search_providers": {"searxng": {"base_url": "ftp://x"}}}, "http or https URL"),
        ({"search_providers": {"brave": {}}, "search_priority": ["searxng"]}, "search_priority[0]"),
    ],
)
def test_a_bad_search_block_is_config_invalid(block: dict[str, Any], why: str) -> None:
    with pytest.raises(Invalid, match=why.replace("[", r"\[").replace("]", r"\]")) as caught:
        search_config(block)
    assert caught.value.code == "config_invalid"


@pytest.mark.django_db
@pytest.mark.usefixtures("agents", "no_workers")
def test_web_search_filter_reaches_the_run_only_with_narrowed_hosts_and_is_no_longer_inert() -> None:
    from apps.runs import services
    from apps.runs.prompt import Segment
    from apps.runs.run_options import RunOptions
    from tests.conftest import ALICE

    def create(hosts: list[str] | None, mode: str | None) -> Any:
        data = services.RunCreate(
            agent="echo", segments=[Segment(text="hi")], allowed_hosts=hosts, options=RunOptions(web_search_filter=mode)
        )
        return services.run_create(principal=ALICE, data=data)

    assert create(["localhost"], "keep").routing["web_search_filter"] == "keep"
    assert create(["localhost"], None).routing["web_search_filter"] == "drop"
    run = create(None, "keep")
    assert "web_search_filter" not in run.routing
    assert not RunEvent.objects.filter(run_id=run.id, type="capability_inert").exists()
