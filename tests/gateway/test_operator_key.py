"""The operator-key restriction for /v1/embeddings (issue 33, item 6): the chat endpoints are
tested over HTTP (tests/gateway/test_gateway_api.py); here the embedder side of the same check,
which /v1/embeddings runs after choosing the embedder and before admitting the call."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from apps.core.errors import Forbidden
from apps.core.scopes import ADMIN, CHANNEL_PUBLISH, CHANNEL_READ, OPERATOR_KEY, RUNS_CREATE, RUNS_READ, USER
from apps.core.scopes import TENANT as TENANT_SCOPE
from apps.core.types import Principal
from apps.gateway.embedders.hashing import HashingEmbedder
from apps.gateway.embedders.http import HttpEmbedderConfig, OpenAIEmbedder
from apps.gateway.operator_key import operator_key_check
from apps.substrate import auth

MEMBER = Principal(tenant_id="acme", subject="m", scopes=frozenset({"runs:create", "runs:read"}))
KEYHOLDER = Principal(tenant_id="acme", subject="k", scopes=frozenset({"runs:create", "providers:operator-key"}))
TENANT = Principal(tenant_id="acme", subject="t", scopes=frozenset({"substrate:tenant"}))


def keyed(api_key: str | None) -> OpenAIEmbedder:
    config = HttpEmbedderConfig(id="openai", model="m", base_url="http://127.0.0.1:9/v1", dimensions=3, api_key=api_key)
    return OpenAIEmbedder(config)


def test_a_keyed_embedder_is_refused_to_a_principal_without_the_scope() -> None:
    with pytest.raises(Forbidden) as refused:
        operator_key_check(MEMBER, keyed("sk-operator"), "openai")
    assert refused.value.status == 403 and refused.value.code == "operator_key_restricted"
    for allowed in (KEYHOLDER, TENANT):
        operator_key_check(allowed, keyed("sk-operator"), "openai")


def test_keyless_embedders_stay_open_and_the_restriction_can_be_turned_off(settings: Any) -> None:
    operator_key_check(MEMBER, HashingEmbedder(), "hashing")
    operator_key_check(MEMBER, keyed(None), "openai")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, operator_key_restriction=False)
    operator_key_check(MEMBER, keyed("sk-operator"), "openai")


def test_the_restriction_reads_the_same_implication_table_as_the_route_gate() -> None:
    """One rule (apps.core.scopes): whatever scope set a token holds, the gateway's
    restriction and the route gate answer the same for providers:operator-key."""
    names = [ADMIN, TENANT_SCOPE, USER, RUNS_CREATE, RUNS_READ, CHANNEL_PUBLISH, CHANNEL_READ, OPERATOR_KEY]
    for held in (frozenset(c) for n in range(3) for c in itertools.combinations(names, n)):
        principal = Principal(tenant_id="acme", subject="p", scopes=held)
        assert principal.may_spend_operator_keys is auth.has_scope(held, OPERATOR_KEY), held
