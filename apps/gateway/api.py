"""Gateway routes (SPEC 2.11): POST /v1/chat/completions, /v1/_llm/chat and
/v1/embeddings. Any authenticated principal (SPEC 2.1).

Every view is async: a call waits on its provider on the event loop, holding
no thread. Each one is auth -> body -> `calls` (routing, fairness, provider,
audit) or `embeddings` (the embedder) -> wire shape (`compat`, `native`). The call is audited from the moment it is
authenticated, so a refused body is a row too.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from ninja import Router

from apps.core.http import openapi_body, parse_body, request_principal
from apps.gateway import compat, native
from apps.gateway.calls import Call, ChatSpec, caller_user_id, chat_open, chat_reply
from apps.gateway.catalog import served_models
from apps.gateway.embeddings import embeddings_create
from apps.gateway.models import Endpoint
from apps.gateway.schemas import (
    ChatCompletionIn,
    ChatCompletionOut,
    EmbeddingsIn,
    EmbeddingsOut,
    LlmChatIn,
    LlmChatOut,
    ModelsOut,
)
from apps.gateway.sse import StreamBody, stream_chunks

router = Router(tags=["gateway"])

CHAT_MAX_BYTES = 1024 * 1024  # SPEC 2.0: OpenAI-compat and gateway bodies
EMBEDDINGS_MAX_BYTES = 8 * 1024 * 1024  # batches of texts are large
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _json(call: Call, body: object) -> HttpResponse:
    return HttpResponse(compat.dumps(body), content_type="application/json", headers={"X-Request-Id": call.request_id})


def _sse(call: Call, chunks: StreamBody) -> StreamingHttpResponse:
    headers = {**_SSE_HEADERS, "X-Request-Id": call.request_id}
    return StreamingHttpResponse(chunks, content_type="text/event-stream", headers=headers)


@router.get(
    "/models", response=ModelsOut, summary="OpenAI models list: what the gateway can serve (aliases, tiers' models)"
)
def models_list(request: HttpRequest) -> dict[str, object]:
    request_principal(request)  # any authenticated principal, as the calls themselves
    return {"object": "list", "data": served_models()}


@router.post(
    "/chat/completions",
    response=ChatCompletionOut,
    openapi_extra=openapi_body(ChatCompletionIn),
    summary="OpenAI Chat Completions (JSON, or chat.completion.chunk SSE with stream:true)",
)
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    call = Call(principal=request_principal(request), endpoint=Endpoint.CHAT_COMPLETIONS, user_id="", stream=False)
    try:
        data = parse_body(request, ChatCompletionIn, max_bytes=CHAT_MAX_BYTES)
        user_id = caller_user_id(call.principal, data.loomcycle_user_id or data.user)
        call.describe(user_id=user_id, stream=data.stream, model=data.model)
        spec = compat.chat_spec(data)
    except BaseException as exc:
        await call.fail(exc)
        raise
    first = await chat_open(call, spec)
    completion_id = compat.new_completion_id()
    if not data.stream:
        reply = await chat_reply(call, first)
        return _json(call, compat.completion_body(completion_id=completion_id, model=call.model, reply=reply))
    include_usage = bool(data.stream_options and data.stream_options.include_usage)
    frames = compat.ChunkStream(completion_id=completion_id, model=call.model, include_usage=include_usage)
    return _sse(call, StreamBody(call, stream_chunks(call, first, frames.start(), frames)))


@router.post(
    "/_llm/chat",
    response=LlmChatOut,
    openapi_extra=openapi_body(LlmChatIn),
    summary="loomcycle's native LLM call (JSON, or named SSE events with stream:true)",
)
async def llm_chat(request: HttpRequest) -> HttpResponseBase:
    call = Call(principal=request_principal(request), endpoint=Endpoint.LLM_CHAT, user_id="", stream=False)
    try:
        data = parse_body(request, LlmChatIn, max_bytes=CHAT_MAX_BYTES)
        call.describe(user_id=caller_user_id(call.principal, data.user_id), stream=data.stream, model=data.model or "")
        spec: ChatSpec = native.chat_spec(data)
    except BaseException as exc:
        await call.fail(exc)
        raise
    first = await chat_open(call, spec)
    if not data.stream:
        reply = await chat_reply(call, first)
        body = native.reply_body(request_id=call.request_id, provider=call.provider, model=call.model, reply=reply)
        return _json(call, body)
    frames = native.FrameStream()
    head = frames.start(provider=call.provider, model=call.model, request_id=call.request_id)
    return _sse(call, StreamBody(call, stream_chunks(call, first, head, frames)))


@router.post(
    "/embeddings",
    response=EmbeddingsOut,
    openapi_extra=openapi_body(EmbeddingsIn),
    summary="OpenAI Embeddings over the configured embedder",
)
async def embeddings(request: HttpRequest) -> HttpResponseBase:
    call = Call(principal=request_principal(request), endpoint=Endpoint.EMBEDDINGS, user_id="", stream=False)
    try:
        data = parse_body(request, EmbeddingsIn, max_bytes=EMBEDDINGS_MAX_BYTES)
        call.describe(user_id=caller_user_id(call.principal, data.user), stream=False, model=data.model)
        done = await embeddings_create(call=call, texts=data.texts(), model=data.model)
    except BaseException as exc:
        await call.fail(exc)
        raise
    await call.finish(200)
    body = compat.embeddings_body(vectors=done.vectors, model=done.model, encoding_format=data.encoding_format)
    return _json(call, body)
