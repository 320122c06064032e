"""An offline, deterministic embedder: signed feature hashing (no model, no network).

Features are the text's lower-cased words (common English function words
left out unless nothing else is there) and each word's character trigrams
(`#word#` padded, weighted lower), hashed with keyed BLAKE2b into
`dimensions` buckets with a sign bit, then L2-normalised. Identical texts get
identical vectors in every process; texts sharing words or word stems come
out close under cosine. It is no semantic model (synonyms are not close),
which is why it is the default only for the embedded setup and tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import unicodedata

from apps.gateway.embedders.base import Embedder, l2_normalised

MODEL = "hashing-v1"  # bump when the features change: stored vectors name the model that made them
WORD_RE = re.compile(r"\w+")
TRIGRAM_WEIGHT = 0.4
INLINE_CHARS = 50_000  # above this, `aembed` hashes on a thread, off the event loop
STOPWORDS = frozenset(
    "a an and are as at be been but by can did do does for from had has have he her his i if in into is it its "
    "me my no not of on or our she so than that the their them then there these they this to was we were what "
    "when which who will with you your".split()
)


def _bucket(feature: str, dimensions: int) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8, person=b"lc-hash-v1").digest()
    value = int.from_bytes(digest, "big")
    return value % dimensions, (1.0 if value >> 63 else -1.0)


def features(text: str) -> list[tuple[str, float]]:
    words = WORD_RE.findall(unicodedata.normalize("NFKC", text).lower())
    content = [w for w in words if w not in STOPWORDS] or words
    if not content:
        return [("e:", 1.0)]  # empty or punctuation-only: one fixed feature, never a zero vector
    out: list[tuple[str, float]] = []
    for word in content:
        out.append((f"w:{word}", 1.0))
        padded = f"#{word}#"
        out.extend((f"c:{padded[i : i + 3]}", TRIGRAM_WEIGHT) for i in range(len(padded) - 2))
    return out


def hash_embed(text: str, dimensions: int) -> list[float]:
    vector = [0.0] * dimensions
    for feature, weight in features(text):
        index, sign = _bucket(feature, dimensions)
        vector[index] += sign * weight
    return l2_normalised(vector)


class HashingEmbedder(Embedder):
    def __init__(self, *, id: str = "hashing", dimensions: int = 384) -> None:
        self.id = id
        self.model = MODEL
        self.dimensions = dimensions

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [hash_embed(text, self.dimensions) for text in texts]

    async def aembed(self, texts: list[str]) -> list[list[float]]:
        if sum(len(t) for t in texts) <= INLINE_CHARS:
            return self.embed(texts)
        return await asyncio.to_thread(self.embed, texts)
