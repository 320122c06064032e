"""One `/v1/embeddings` call: choosing the configured embedder, admitting the
call, calling it and checking what it answered.

Invariants:
- the call is routed to the embedder before admission, so its audit row
  names the embedder whatever the outcome;
- the embedder is not a chat provider: admission takes no provider gate;
- the answer has exactly one vector per input text, else 502 embed_failed.
The caller owns the call's outcome (`Call.fail` / `Call.finish`).
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.core.errors import ApplicationError
from apps.gateway.calls import Call
from apps.gateway.embedders import EmbedError, get_embedder
from apps.gateway.operator_key import operator_key_check


class EmbedderNotConfigured(ApplicationError):
    status, code = 503, "embedder_not_configured"


class EmbedFailed(ApplicationError):
    status, code = 502, "embed_failed"


@dataclass(frozen=True)
class Embedded:
    vectors: list[list[float]]
    model: str  # the requested model name, else the embedder's


async def embeddings_create(*, call: Call, texts: list[str], model: str) -> Embedded:
    """Embed `texts` with the configured embedder; EmbedderNotConfigured (503) or EmbedFailed (502)."""
    embedder = get_embedder()
    if embedder is None:
        raise EmbedderNotConfigured(
            "no embedder configured: set memory.embedder in loomcycle.yaml or LOOMCYCLE_EMBEDDER",
            headers={"x-should-retry": "false"},
        )
    call.routed(embedder.id, embedder.model)
    operator_key_check(call.principal, embedder, embedder.id)  # 403 for a keyed embedder without the scope
    await call.admit(provider_gate=False)  # the embedder is not a chat provider: no provider gate
    try:
        vectors = await embedder.aembed(texts)
    except EmbedError as exc:
        retry = {"x-should-retry": "true" if exc.retryable else "false"}
        raise EmbedFailed(str(exc), details={"provider_status": exc.status}, headers=retry) from exc
    if len(vectors) != len(texts):
        raise EmbedFailed(f"{embedder.id}: {len(vectors)} vectors for {len(texts)} inputs")
    return Embedded(vectors, model or embedder.model)
