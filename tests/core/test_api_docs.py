"""The API description (/v1/openapi.json) and its Swagger page (/v1/docs).

The schema must be a valid OpenAPI document in which every reference
resolves and every operation documents its responses; the page must render
with no network beyond loopback (ninja's bundled swagger-ui, no CDN)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate
from playwright.sync_api import Route, sync_playwright

from loomcycle_project.api import api
from tests.factories.observability import CHROMIUM, CHROMIUM_ARGS

LOOPBACK_PREFIXES = ("http://127.0.0.1:", "http://localhost:")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return dict(api.get_openapi_schema(path_prefix="/v1/"))


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, item in schema["paths"].items() for method, op in item.items()]


def refs(node: Any) -> list[str]:
    """Every `$ref` value anywhere under `node`."""
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in refs(value)]
    return []


def resolve(schema: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = schema
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def test_openapi_schema_is_valid_and_every_reference_resolves(schema: dict[str, Any]) -> None:
    validate(json.loads(json.dumps(schema)))
    unresolved = []
    for ref in set(refs(schema)):
        try:
            resolve(schema, ref)
        except KeyError:
            unresolved.append(ref)
    assert unresolved == []
    assert "$defs" not in json.dumps(schema["paths"])


def test_every_operation_documents_success_and_error_responses(schema: dict[str, Any]) -> None:
    ops = operations(schema)
    assert len(ops) > 50
    for method, path, op in ops:
        responses = op["responses"]
        success = {status: r for status, r in responses.items() if status.startswith("2")}
        assert success, (method, path)
        for status, response in success.items():
            assert bool(response.get("content")) == (status != "204"), (method, path, status)
        for status in ("400", "401", "404", "422", "500"):
            error_schema = responses[status]["content"]["application/json"]["schema"]
            assert error_schema == {"$ref": "#/components/schemas/Error"}, (method, path, status)
        assert ("413" in responses and "415" in responses) == ("requestBody" in op), (method, path)
        assert op["security"] == [{"BearerAuth": []}], (method, path)
    assert schema["components"]["securitySchemes"]["BearerAuth"] == {"type": "http", "scheme": "bearer"}
    assert set(schema["components"]["schemas"]["Error"]["required"]) == {"code", "error"}


def test_an_interrupt_answer_documents_that_the_ask_may_have_expired(schema: dict[str, Any]) -> None:
    resolve = schema["paths"]["/v1/runs/{run_id}/interrupts/{interrupt_id}/resolve"]["post"]["responses"]
    assert "interrupt_expired" in resolve["410"]["description"]
    assert all("410" not in op["responses"] for _, path, op in operations(schema) if not path.endswith("/resolve"))


def test_streams_are_documented_as_event_streams(schema: dict[str, Any]) -> None:
    paths = schema["paths"]
    stream = paths["/v1/runs/{run_id}/stream"]["get"]["responses"]["200"]["content"]
    assert list(stream) == ["text/event-stream"]
    for path in ("/v1/runs", "/v1/sessions/{session_id}/messages"):
        create = paths[path]["post"]["responses"]
        assert list(create["200"]["content"]) == ["text/event-stream"]
        assert create["202"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/RunCreatedOut"}
    for path in ("/v1/chat/completions", "/v1/_llm/chat"):
        assert set(paths[path]["post"]["responses"]["200"]["content"]) == {"text/event-stream", "application/json"}


def test_building_the_schema_twice_gives_the_same_document(schema: dict[str, Any]) -> None:
    assert json.dumps(dict(api.get_openapi_schema(path_prefix="/v1/")), sort_keys=True) == json.dumps(
        schema, sort_keys=True
    )


def test_nested_body_models_are_components(schema: dict[str, Any]) -> None:
    body = schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    messages = body["properties"]["messages"]["items"]
    assert messages == {"$ref": "#/components/schemas/ChatMessageIn"}
    assert "ContentPartIn" in schema["components"]["schemas"]
    assert "Segment" in schema["components"]["schemas"]


def test_docs_page_renders_offline(web: str) -> None:
    """Headless Chromium opens /v1/docs of the real web process; every request
    off loopback is aborted and recorded, and there must be none."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does as root)"
    artifacts = Path(os.environ["LOOMCYCLE_DATA_DIR"]) / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    blocked: list[str] = []

    def loopback_only(route: Route) -> None:
        url = route.request.url
        if url.startswith(LOOPBACK_PREFIXES):
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.route("**/*", loopback_only)
            page.goto(f"{web}/v1/docs")
            page.wait_for_selector(".opblock", timeout=20_000)
            rendered = page.locator(".opblock").count()
            authorize = page.locator("button.authorize").count()
            shot = artifacts / "docs.png"
            page.screenshot(path=str(shot), full_page=False)
        finally:
            browser.close()
    print(f"screenshot: {shot}")
    assert blocked == []
    assert rendered >= 50
    assert authorize == 1


def test_operation_ids_are_the_view_names_unique_and_readable(schema: dict[str, Any]) -> None:
    ids = [op["operationId"] for _, _, op in operations(schema)]
    assert len(ids) == len(set(ids))
    for op_id in ids:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", op_id) and not op_id.startswith("apps_"), op_id
    assert {"runs_create", "runs_get", "runs_stream", "interrupts_resolve", "chat_completions"} <= set(ids)


def test_two_operations_of_one_id_are_refused_when_the_schema_is_built() -> None:
    """Ids are function names: two routers' `items_list` would collide, and the build says where."""
    from loomcycle_project.openapi import complete_schema

    ok = {"200": {"description": "OK"}}
    clash = {
        "paths": {
            "/a": {"get": {"operationId": "items_list", "responses": ok}},
            "/b": {"get": {"operationId": "items_list", "responses": ok}},
        }
    }
    with pytest.raises(ValueError, match="operationId 'items_list' of GET /b is also GET /a's"):
        complete_schema(clash)


def test_sse_operations_document_their_event_schema(schema: dict[str, Any]) -> None:
    for path, method, event in (
        ("/v1/runs/{run_id}/stream", "get", "RunStreamEvent"),
        ("/v1/runs", "post", "RunStreamEvent"),
        ("/v1/chat/completions", "post", "ChatCompletionChunkEvent"),
    ):
        media = schema["paths"][path][method]["responses"]["200"]["content"]["text/event-stream"]
        assert media["x-sse-event"] == {"$ref": f"#/components/schemas/{event}"}
        assert resolve(schema, media["x-sse-event"]["$ref"])["required"]


def test_a_run_read_declares_the_run_schema(schema: dict[str, Any]) -> None:
    ok = schema["paths"]["/v1/runs/{run_id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    run = resolve(schema, ok["$ref"])
    assert {"run_id", "agent_id", "status", "usage", "last_seq"} <= set(run["required"])


def test_every_operation_declares_its_response_schema(schema: dict[str, Any]) -> None:
    untyped = set()
    for _, _, op in operations(schema):
        for status, response in op["responses"].items():
            media = response.get("content", {}).get("application/json", {})
            if status.startswith("2") and media.get("schema") == {"type": "object", "additionalProperties": True}:
                untyped.add(op["operationId"])
    assert untyped == set(), sorted(untyped)
