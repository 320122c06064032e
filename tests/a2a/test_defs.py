"""A2AServerCardDef and A2AAgentDef: versioned like every kind (REST op dispatch, admin
pages), validated with refusals a caller can act on, and hashed by a recipe this runtime
pins here (loomcycle publishes no vectors for these kinds)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from django.test import Client
from django.urls import reverse

from apps.substrate.kinds import get_kind
from apps.substrate.models import A2AAgentDef, A2AServerCardDef

CARD = {"description": "front desk", "exposed_agents": [{"agent_name": "echo", "tags": ["demo"]}]}
PEER = {"endpoint": "https://example.com/a2a", "auth": {"bearer_credential_ref": "peer_token"}}

# Pinned: a change to the normaliser or the recipe that moves these is a breaking change for
# anyone who verifies a deployed definition by its hash.
VECTORS = [
    ("a2aservercard", "front", {"exposed_agents": [{"agent_name": "echo"}]},
     "sha256:9228bb232235b7cabe539b9ffed9e58e16622ed0d2fc4d5d1ebcf8f2274cec9c"),
    ("a2aagent", "peer", {"endpoint": "http://localhost:9/a2a", "auth": {"bearer_credential_ref": "peer_token"}},
     "sha256:e1687a699837a18a66bd1679ea44e8497d67451827e46defba38b04c864c474a"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "name", "overlay", "expected"), VECTORS)
def test_content_hash_vectors_are_pinned(kind: str, name: str, overlay: dict[str, Any], expected: str) -> None:
    k = get_kind(kind)
    definition = k.normalise(name, overlay, True)
    assert k.content_hash is not None
    assert k.content_hash(name, definition) == expected
    # Defaults written out and key order do not change it: the hash is of the normalised form.
    again = k.normalise(name, dict(reversed(list({**overlay}.items()))), True)
    assert k.content_hash(name, again) == expected


@pytest.mark.usefixtures("transactional_db")
@pytest.mark.parametrize(
    ("kind", "overlay", "message"),
    [
        ("a2aservercard", {"exposed_agents": []}, "at least one agent"),
        ("a2aservercard", {"exposed_agents": [{"agent_name": "echo"}, {"agent_name": "echo"}]}, "unique"),
        ("a2aservercard", {**CARD, "sign_with_key_env": "LOOMCYCLE_KEY"}, "does not sign"),
        ("a2aservercard", {**CARD, "security_schemes": [{"kind": "magic"}]}, "security scheme"),
        ("a2aagent", {}, "exactly one of agent_card_url and endpoint"),
        ("a2aagent", {**PEER, "verify_signed_card": True}, "does not verify"),
        ("a2aagent", {**PEER, "binding": "grpc"}, "binding must be jsonrpc"),
        ("a2aagent", {"endpoint": "ftp://example.com/a2a"}, "http or https"),
        ("a2aagent", {"endpoint": "https://evil.test/a2a"}, "LOOMCYCLE_HTTP_HOST_ALLOWLIST"),
        ("a2aagent", {"endpoint": "https://example.com/a", "surprise": 1}, "unknown field"),
    ],
)
def test_bad_definitions_are_refused_with_a_422_naming_the_field(
    http: httpx.Client, people: dict[str, dict[str, str]], kind: str, overlay: dict[str, Any], message: str
) -> None:
    resp = http.post(
        f"/v1/_{kind}def", headers=people["alice"], json={"op": "create", "name": "bad", "overlay": overlay}
    )
    assert resp.status_code == 422, resp.text
    body = resp.json()
    assert (body["code"], body["tool"]) == ("tool_refused", get_kind(kind).tool)
    assert message in body["error"]


@pytest.mark.usefixtures("transactional_db")
@pytest.mark.parametrize(("kind", "overlay"), [("a2aservercard", CARD), ("a2aagent", PEER)])
def test_both_kinds_are_versioned_over_rest_per_tenant(
    http: httpx.Client, people: dict[str, dict[str, str]], kind: str, overlay: dict[str, Any]
) -> None:
    alice, charlie = people["alice"], people["charlie"]
    path = f"/v1/_{kind}def"
    v1 = http.post(path, headers=alice, json={"op": "create", "name": "desk", "overlay": overlay}).json()
    assert v1["version"] == 1 and v1["content_sha256"].startswith("sha256:")
    again = http.post(path, headers=alice, json={"op": "create", "name": "desk", "overlay": overlay}).json()
    assert again["deduplicated"] is True and again["def_id"] == v1["def_id"]
    v2 = http.post(path, headers=alice, json={"op": "fork", "name": "desk", "overlay": {"description": "v2"}}).json()
    assert (v2["version"], v2["parent_def_id"], v2["promoted"]) == (2, v1["def_id"], True)
    verify = http.post(
        path, headers=alice, json={"op": "verify", "name": "desk", "content_sha256": v2["content_sha256"]}
    )
    assert verify.json()["matches"] is True
    listed = http.post(path, headers=alice, json={"op": "list", "name": "desk"}).json()
    assert [row["version"] for row in listed["versions"]] == [2, 1]
    names = http.get(f"{path}/names", headers=alice).json()["names"]
    assert [n["name"] for n in names] == ["desk"]
    # Another tenant sees none of it.
    assert http.post(path, headers=charlie, json={"op": "get", "def_id": v1["def_id"]}).status_code == 404
    assert http.get(f"{path}/names", headers=charlie).json()["names"] == []
    retired = http.post(path, headers=alice, json={"op": "retire", "def_id": v2["def_id"], "retired": True}).json()
    assert retired["retired"] is True


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("model", "kind", "overlay"), [(A2AServerCardDef, "a2aservercard", CARD), (A2AAgentDef, "a2aagent", PEER)]
)
def test_admin_creates_through_the_service_and_renders_every_page(
    admin_client: Client, model: Any, kind: str, overlay: dict[str, Any]
) -> None:
    opts = model._meta
    add = reverse(f"admin:{opts.app_label}_{opts.model_name}_add")
    data = {"name": "desk", "tenant_id": "", "definition": json.dumps(overlay), "description": "", "promote": "on"}
    resp = admin_client.post(add, data)
    assert resp.status_code == 302, resp.content[:2000]
    row = model.objects.get(name="desk")
    assert row.version == 1 and row.content_sha256.startswith("sha256:")
    assert row.definition == get_kind(kind).normalise("desk", overlay, True)
    changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
    assert admin_client.get(changelist).status_code == 200
    assert (
        admin_client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[row.id])).status_code == 200
    )
    bad = admin_client.post(add, {**data, "name": "bad", "definition": json.dumps({"exposed_agents": []})})
    assert bad.status_code == 200 and model.objects.filter(name="bad").count() == 0
