"""Text embedders for `/v1/embeddings` and memory vectors (384-dim pgvector column).

`get_embedder()` is the one entry point: the configured embedder, built once
per process, or None when none is configured."""

from apps.gateway.embedders.base import Embedder, EmbedError
from apps.gateway.embedders.registry import get_embedder

__all__ = ["EmbedError", "Embedder", "get_embedder"]
