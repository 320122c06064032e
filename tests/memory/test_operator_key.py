"""The operator-key restriction on memory embeddings (issue 33, item 6; review): a
principal's memory write with `embed` or search through REST or the MCP server's
memory tools spends the operator's embedder key only if the principal may
(providers:operator-key, held or implied), as /v1/embeddings. The keyed embedder is
our OpenAI driver against a loopback server speaking OpenAI's embeddings wire
format; the keyless one is hashing. A run's own Memory tool embeds for no principal
and is not gated.

Both transports reach these functions only past their scope gate, which asks for
substrate:tenant (implying providers:operator-key) today; the functions under the
gate are called here with a narrower principal so the check holds wherever a later
route lets one in."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from django.conf import LazySettings
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from apps.core.errors import Forbidden
from apps.core.types import Principal
from apps.mcp.server import tools_data
from apps.memory import keyops, selectors, services
from apps.memory.services import Slot

pytestmark = pytest.mark.django_db

MEMBER = Principal(tenant_id="acme", subject="m", scopes=frozenset({"runs:create", "runs:read"}))
KEYHOLDER = Principal(tenant_id="acme", subject="k", scopes=frozenset({"runs:read", "providers:operator-key"}))
SLOT = Slot("acme", "tenant", "")
OPERATOR_KEY = "sk-operator-memory-0123456789"


@pytest.fixture
def upstream(httpserver: HTTPServer) -> list[dict[str, Any]]:
    """OpenAI's /v1/embeddings on loopback: 384-dimension vectors, each request recorded."""
    seen: list[dict[str, Any]] = []

    def handler(request: Request) -> Response:
        body = json.loads(request.get_data())
        seen.append({"authorization": request.headers.get("authorization"), "body": body})
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": [1.0] + [0.0] * 383} for i in range(len(texts))]
        doc = {"object": "list", "model": body["model"], "data": data, "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        return Response(json.dumps(doc), status=200, content_type="application/json")

    httpserver.expect_request("/v1/embeddings", method="POST").respond_with_handler(handler)
    return seen


@pytest.fixture
def keyed(settings: LazySettings, httpserver: HTTPServer) -> None:
    """The embedder is OpenAI's, called with the operator's OPENAI_API_KEY."""
    conf = settings.LOOMCYCLE
    settings.LOOMCYCLE = dataclasses.replace(
        conf,
        embedder="openai",
        openai_base_url=httpserver.url_for("/v1"),
        provider_keys={**conf.provider_keys, "OPENAI_API_KEY": OPERATOR_KEY},
    )


def refused(exc: pytest.ExceptionInfo[Forbidden]) -> None:
    assert (exc.value.status, exc.value.code) == (403, "operator_key_restricted")
    assert exc.value.details["required_scope"] == "providers:operator-key"


@pytest.mark.usefixtures("keyed")
def test_a_principal_without_the_scope_may_not_embed_with_the_operators_key(upstream: list[dict[str, Any]]) -> None:
    with pytest.raises(Forbidden) as put:
        keyops.key_put(MEMBER, "tenant", "-", "k", keyops.MemoryPutIn(value="the cat", embed=True), False)
    refused(put)
    with pytest.raises(Forbidden) as mcp_set:
        tools_data._memory_set(MEMBER, tools_data.MemorySetArgs(scope="tenant", key="k", value="x", embed=True))
    refused(mcp_set)
    with pytest.raises(Forbidden) as search:
        keyops.search(MEMBER, keyops.MemorySearchIn(query="cat", scope="tenant"))
    refused(search)
    with pytest.raises(Forbidden) as mcp_search:
        tools_data._memory_search(MEMBER, tools_data.MemorySearchArgs(query="cat", scope="tenant"))
    refused(mcp_search)
    assert upstream == [] and selectors.memory_get(slot=SLOT, key="k") is None  # nothing spent, nothing written
    # Without `embed` nothing is spent: the write is the member's to make.
    assert keyops.key_put(MEMBER, "tenant", "-", "k", keyops.MemoryPutIn(value="the cat"), False)["embedded"] is False


@pytest.mark.usefixtures("keyed")
def test_a_principal_with_the_scope_and_a_runs_own_tool_embed_with_it(upstream: list[dict[str, Any]]) -> None:
    out = keyops.key_put(KEYHOLDER, "tenant", "-", "k", keyops.MemoryPutIn(value="the cat", embed=True), False)
    assert out["embedded"] is True and upstream[0]["authorization"] == f"Bearer {OPERATOR_KEY}"
    found = tools_data._memory_search(KEYHOLDER, tools_data.MemorySearchArgs(query="cat", scope="tenant"))
    assert [hit["key"] for hit in found["entries"]] == ["k"]
    assert services.memory_set(slot=SLOT, key="run", value="x", embed=True).embedded is True  # no principal: a run's
    assert len(upstream) == 3


def test_a_keyless_embedder_stays_open_to_every_principal() -> None:
    out = keyops.key_put(MEMBER, "tenant", "-", "k", keyops.MemoryPutIn(value="the cat sat", embed=True), False)
    assert out["embedded"] is True and "embed_warning" not in out
    found = keyops.search(MEMBER, keyops.MemorySearchIn(query="cat", scope="tenant"))
    assert [(hit["key"], hit["embedded_with"]["provider"]) for hit in found["entries"]] == [("k", "hashing")]
