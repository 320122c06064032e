"""The embedder interface: texts in, one vector of `dimensions` floats per text out.

`embed` is the blocking path (workers, memory writes); `aembed` runs on the
web event loop (`/v1/embeddings`). Upstream failures are `EmbedError`
(the API answers 502 `embed_failed`); a wrong configuration is
`apps.core.errors.Invalid(code="config_invalid")` when the embedder is built.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence


class EmbedError(Exception):
    """An embedding call failed upstream. `status` is the HTTP status (0 = transport
    failure or a bad answer); 429, 5xx and 0 are worth retrying later."""

    def __init__(self, message: str, *, provider: str = "", status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.status == 429 or self.status >= 500 or self.status == 0


class Embedder(ABC):
    id: str  # "hashing", "openai", "gemini", "voyage", "ollama", "minilm", or a yaml providers: name
    model: str
    dimensions: int

    @abstractmethod
    def embed(self, texts: list[str]) -> list[list[float]]:
        """Blocking (worker threads, memory writes)."""

    @abstractmethod
    async def aembed(self, texts: list[str]) -> list[list[float]]:
        """The same vectors without blocking the event loop."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id}/{self.model} dim={self.dimensions}>"


def batches(texts: Sequence[str], size: int) -> Iterator[list[str]]:
    """`texts` in order, at most `size` at a time (size < 1 = one batch)."""
    step = size if size > 0 else max(1, len(texts))
    for start in range(0, len(texts), step):
        yield list(texts[start : start + step])


def checked(embedder: Embedder, vectors: list[list[float]], expected: int) -> list[list[float]]:
    """The vectors if there is one per text, each of the configured size and finite; else EmbedError."""
    if len(vectors) != expected:
        raise EmbedError(f"{embedder.id}: {len(vectors)} vectors for {expected} texts", provider=embedder.id)
    for vector in vectors:
        if len(vector) != embedder.dimensions:
            raise EmbedError(
                f"{embedder.id}: model {embedder.model} returned {len(vector)}-dimension vectors, "
                f"{embedder.dimensions} configured (memory.embedder.dimensions)",
                provider=embedder.id,
            )
        if not all(math.isfinite(x) for x in vector):
            raise EmbedError(f"{embedder.id}: model {embedder.model} returned a non-finite value", provider=embedder.id)
    return vectors


def l2_normalised(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector
