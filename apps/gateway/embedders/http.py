"""Embedders behind an HTTP API: OpenAI-compatible, Gemini, Voyage, Ollama.

Each splits its texts into batches of `batch_size` (one request per batch,
in order), waits at most `timeout_s` per request, and checks that every
vector has the configured size. A 4xx/5xx answer is `EmbedError("<id>
<status>: <the provider's own message>")`; a connect failure or timeout is
`EmbedError("<id> http: ...")` (status 0); an answer of the wrong shape is
status 502.

Wire shapes:
- openai: POST {base_url}/embeddings {input: [..], model, encoding_format:
  "float", dimensions?} -> {data: [{index, embedding}]}; also vLLM, LM Studio,
  Ollama's /v1 and other OpenAI-compatible servers.
- gemini: POST {base_url}/models/{model}:batchEmbedContents {requests:
  [{model: "models/{model}", content: {parts: [{text}]}, outputDimensionality?}]}
  -> {embeddings: [{values}]}, key in `x-goog-api-key`.
- voyage: POST {base_url}/embeddings {input: [..], model, output_dimension?}
  -> {data: [{index, embedding}]}.
- ollama: POST {base_url}/api/embed {model, input: [..], dimensions?} ->
  {embeddings: [[..]]}; a key (Ollama cloud) goes as a bearer token.
"""

from __future__ import annotations

import asyncio
import json
import threading
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

import httpx

from apps.gateway.embedders.base import Embedder, EmbedError, batches, checked

MAX_ERROR_BODY = 64 * 1024


@dataclass(frozen=True)
class HttpEmbedderConfig:
    id: str
    model: str
    base_url: str
    dimensions: int
    api_key: str | None = None
    send_dimensions: bool = False  # ask the API for `dimensions` (only models that can shorten their vectors)
    timeout_s: float = 30.0
    batch_size: int = 100


@dataclass(frozen=True)
class EmbedCall:
    url: str
    headers: dict[str, str]
    body: dict[str, Any]


def error_text(body: bytes) -> str:
    """The provider's own message from an error body, whichever of the usual shapes it has."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:500] or "(empty body)"
    if isinstance(doc, list) and doc:
        doc = doc[0]
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and err.get("message"):
            return f"{err['status']}: {err['message']}" if err.get("status") else str(err["message"])
        if isinstance(err, str) and err:
            return err  # Ollama
        for key in ("detail", "message"):  # Voyage says "detail"
            if isinstance(doc.get(key), str) and doc[key]:
                return str(doc[key])
    return json.dumps(doc)[:500]


class HttpEmbedder(Embedder):
    def __init__(self, config: HttpEmbedderConfig) -> None:
        self.config = config
        self.id = config.id
        self.model = config.model
        self.dimensions = config.dimensions
        self._timeout = httpx.Timeout(config.timeout_s)
        self._client: httpx.Client | None = None
        self._aclients: WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = WeakKeyDictionary()
        self._lock = threading.Lock()

    @abstractmethod
    def call(self, texts: list[str]) -> EmbedCall:
        """The request for one batch."""

    @abstractmethod
    def vectors(self, doc: Any) -> list[list[float]]:
        """The vectors of one answer, in input order (KeyError/TypeError/ValueError = wrong shape)."""

    # --- blocking / async ------------------------------------------------------------

    def embed(self, texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for batch in batches(texts, self.config.batch_size):
            call = self.call(batch)
            try:
                response = self._sync_client().post(call.url, headers=call.headers, json=call.body)
            except httpx.HTTPError as exc:
                raise self._transport_error(exc) from exc
            out.extend(self._answer(response.status_code, response.content, len(batch)))
        return out

    async def aembed(self, texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for batch in batches(texts, self.config.batch_size):
            call = self.call(batch)
            try:
                response = await self._async_client().post(call.url, headers=call.headers, json=call.body)
            except httpx.HTTPError as exc:
                raise self._transport_error(exc) from exc
            out.extend(self._answer(response.status_code, response.content, len(batch)))
        return out

    # --- shared ----------------------------------------------------------------------

    def _answer(self, status: int, body: bytes, count: int) -> list[list[float]]:
        if status >= 400:
            message = error_text(body[:MAX_ERROR_BODY])
            raise EmbedError(f"{self.id} {status}: {message}", provider=self.id, status=status)
        try:
            vectors = self.vectors(json.loads(body))
            vectors = [[float(x) for x in vector] for vector in vectors]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EmbedError(
                f"{self.id} 502: unexpected answer from {self.model}: {body[:200]!r}", provider=self.id, status=502
            ) from exc
        return checked(self, vectors, count)

    def _transport_error(self, exc: httpx.HTTPError) -> EmbedError:
        kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "failed"
        return EmbedError(f"{self.id} http: request {kind} ({type(exc).__name__}: {exc})", provider=self.id)

    def _sync_client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(timeout=self._timeout)
            return self._client

    def _async_client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        found = self._aclients.get(loop)
        if found is None:
            found = httpx.AsyncClient(timeout=self._timeout)
            self._aclients[loop] = found
        return found

    def _bearer(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}


def _indexed(data: list[dict[str, Any]]) -> list[list[float]]:
    ordered = sorted(data, key=lambda item: int(item.get("index", 0)))
    return [list(item["embedding"]) for item in ordered]


class OpenAIEmbedder(HttpEmbedder):
    def call(self, texts: list[str]) -> EmbedCall:
        body: dict[str, Any] = {"input": texts, "model": self.model, "encoding_format": "float"}
        if self.config.send_dimensions:
            body["dimensions"] = self.dimensions
        return EmbedCall(f"{self.config.base_url}/embeddings", self._bearer(), body)

    def vectors(self, doc: Any) -> list[list[float]]:
        return _indexed(doc["data"])


class VoyageEmbedder(HttpEmbedder):
    def call(self, texts: list[str]) -> EmbedCall:
        body: dict[str, Any] = {"input": texts, "model": self.model}
        if self.config.send_dimensions:
            body["output_dimension"] = self.dimensions
        return EmbedCall(f"{self.config.base_url}/embeddings", self._bearer(), body)

    def vectors(self, doc: Any) -> list[list[float]]:
        return _indexed(doc["data"])


class GeminiEmbedder(HttpEmbedder):
    def call(self, texts: list[str]) -> EmbedCall:
        model = self.model.removeprefix("models/")
        requests = []
        for text in texts:
            one: dict[str, Any] = {"model": f"models/{model}", "content": {"parts": [{"text": text}]}}
            if self.config.send_dimensions:
                one["outputDimensionality"] = self.dimensions
            requests.append(one)
        headers = {"x-goog-api-key": self.config.api_key} if self.config.api_key else {}
        return EmbedCall(f"{self.config.base_url}/models/{model}:batchEmbedContents", headers, {"requests": requests})

    def vectors(self, doc: Any) -> list[list[float]]:
        return [list(item["values"]) for item in doc["embeddings"]]


class OllamaEmbedder(HttpEmbedder):
    def call(self, texts: list[str]) -> EmbedCall:
        body: dict[str, Any] = {"model": self.model, "input": texts}
        if self.config.send_dimensions:
            body["dimensions"] = self.dimensions
        return EmbedCall(f"{self.config.base_url}/api/embed", self._bearer(), body)

    def vectors(self, doc: Any) -> list[list[float]]:
        return [list(vector) for vector in doc["embeddings"]]
