"""`client.gateway`: the LLM gateway (docs/api.md, "LLM gateway"): a model call without a run.

The calls here are answered whole (`stream: false` is sent); for a streamed completion point the
`openai` SDK at `<url>/v1`, the shape the gateway speaks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomcycle_http.client import _base as b

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client

Row = dict[str, Any]
Rows = list[Row]
MODELS = b.Call("GET", "/v1/models")


def whole(path: str, body: dict[str, Any]) -> b.Call:
    return b.Call("POST", path, json={**body, "stream": False})


def embeddings_call(texts: str | list[str], fields: dict[str, Any]) -> b.Call:
    return b.Call("POST", "/v1/embeddings", json={"input": texts, **fields})


class Gateway:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("models_list")
    def models(self) -> Rows:
        """The model ids the gateway can serve (OpenAI's list shape: `{id, object, created, owned_by}`)."""
        return list(self._c.send(MODELS)["data"])

    @b.op("chat_completions")
    def chat_completions(self, **body: Any) -> Row:
        """One OpenAI Chat Completions call (`model`, `messages`, ...): the `chat.completion` object."""
        return dict(self._c.send(whole("/v1/chat/completions", body)))

    @b.op("llm_chat")
    def chat(self, **body: Any) -> Row:
        """One call in loomcycle's native shape (`provider`, `model` or `tier`, `messages`, `tools`, ...)."""
        return dict(self._c.send(whole("/v1/_llm/chat", body)))

    @b.op("embeddings")
    def embeddings(self, texts: str | list[str], **fields: Any) -> Row:
        """Vectors of `texts` from the configured embedder (OpenAI Embeddings' answer)."""
        return dict(self._c.send(embeddings_call(texts, fields)))


class AsyncGateway:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("models_list")
    async def models(self) -> Rows:
        return list((await self._c.send(MODELS))["data"])

    @b.op("chat_completions")
    async def chat_completions(self, **body: Any) -> Row:
        return dict(await self._c.send(whole("/v1/chat/completions", body)))

    @b.op("llm_chat")
    async def chat(self, **body: Any) -> Row:
        return dict(await self._c.send(whole("/v1/_llm/chat", body)))

    @b.op("embeddings")
    async def embeddings(self, texts: str | list[str], **fields: Any) -> Row:
        return dict(await self._c.send(embeddings_call(texts, fields)))
