"""The operator-key restriction at the gateway (SPEC 2.1, 7.3): a principal
without `providers:operator-key` (held, or implied by substrate:tenant or
substrate:admin) may not make the gateway spend the operator's provider keys.
A provider or embedder "spends the operator's key" when this runtime calls it
with a key from its own environment (a built-in provider keyed by
`*_API_KEY`, a yaml provider's `api_key_env`, a keyed HTTP embedder); the mock,
`ollama-local` and the in-process embedders (hashing, MiniLM) spend none and
stay open to every token. Per-tenant credentials (SPEC's CredentialDef) do
not exist here, so such a principal has no keyed provider at all: 403
`operator_key_restricted`. Off with LOOMCYCLE_OPERATOR_KEY_RESTRICTION=0.

Runs are not gated here: a run's provider calls are the operator's agent
definitions at work, and run creation has its own scope (runs:create). Memory
runs the same check for the embeddings it makes for a principal (REST, MCP;
apps.memory.services.embed_one), never for a run's own Memory tool."""

from __future__ import annotations

from django.conf import settings

from apps.core.errors import Forbidden
from apps.core.scopes import OPERATOR_KEY
from apps.core.types import Principal
from apps.gateway.embedders import Embedder
from apps.gateway.embedders.http import HttpEmbedder
from apps.gateway.providers import Provider
from apps.gateway.providers.http import HttpProvider


def spends_operator_key(target: Provider | Embedder) -> bool:
    if isinstance(target, HttpProvider | HttpEmbedder):
        return bool(target.config.api_key)
    return False


def operator_key_check(principal: Principal, target: Provider | Embedder, target_id: str) -> None:
    """403 `operator_key_restricted` when `principal` may not spend the key `target` is called with."""
    if not settings.LOOMCYCLE.operator_key_restriction or principal.may_spend_operator_keys:
        return
    if spends_operator_key(target):
        raise Forbidden(
            f"{target_id} is called with the operator's key, which this token may not spend "
            f"(it lacks the {OPERATOR_KEY} scope)",
            code="operator_key_restricted",
            details={"provider": target_id, "required_scope": OPERATOR_KEY},
        )
