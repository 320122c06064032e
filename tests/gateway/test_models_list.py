"""GET /v1/models: the gateway's servable models in OpenAI's list shape, read by the official
`openai` SDK (tools such as Open WebUI list models this way before calling)."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from apps.gateway.catalog import served_models
from apps.substrate import tokens

pytestmark = pytest.mark.usefixtures("transactional_db")


def test_the_openai_sdk_lists_the_configured_aliases_and_tier_models(web: str) -> None:
    key: str = tokens.token_create(name="models-sdk", tenant_id="ops")["token"]
    with OpenAI(base_url=web + "/v1", api_key=key, max_retries=0, timeout=30) as sdk:
        models = {model.id: model for model in sdk.models.list()}
    # tests/loomcycle.test.yaml: the aliases `steady` (mock-stable) and `always-429` (mock), by name;
    # tier `high`'s not-configured/big is not servable here, so not listed.
    assert models["steady"].owned_by == "mock-stable" and models["steady"].object == "model"
    assert models["always-429"].owned_by == "mock"
    assert not [name for name in models if name.startswith("not-configured/")]
    assert list(models) == sorted(models)


def test_listing_models_needs_a_credential(web: str) -> None:
    answer = httpx.get(web + "/v1/models", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert answer.status_code == 401 and answer.json()["code"] == "unauthorized"


def test_a_tier_candidate_is_listed_as_provider_slash_model_and_defaults_too() -> None:
    config = {
        "tiers": {"low": [{"provider": "mock", "model": "mock-generic"}]},
        "user_tiers": {"default": {}, "pro": {"tiers": {"high": ["mock/mock-tool-loop"]}}},
        "defaults": {"provider": "mock", "model": "mock-default"},
    }
    ids = [model["id"] for model in served_models(config)]
    assert ids == ["mock/mock-default", "mock/mock-generic", "mock/mock-tool-loop"]
