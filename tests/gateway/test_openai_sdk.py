"""The gateway as a drop-in OpenAI endpoint: the official `openai` SDK and
LangChain's ChatOpenAI, pointed at a real Daphne with the mock provider,
work unchanged (plain, streamed, tools, embeddings, errors)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from openai import OpenAI
from pydantic import BaseModel, Field

from apps.gateway.models import GatewayCall
from apps.substrate import tokens
from tests.conftest import wait_for

pytestmark = pytest.mark.usefixtures("transactional_db")

PARIS = "input=%7B%22city%22%3A%22Paris%22%7D"  # the scripted tool input, URL-encoded JSON
TOOL_MODEL = f"mock/mock-tool-loop?tool=get_weather&calls=1&{PARIS}"
FIRST_TOOL_MODEL = f"mock/mock-tool-loop?calls=1&{PARIS}"  # calls the first tool offered
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class GetWeather(BaseModel):
    """Weather for a city."""

    city: str = Field(description="the city")


@pytest.fixture
def api_key() -> str:
    """An operator token as the SDK's api_key: an unknown bearer is a 401 even in open mode."""
    token: str = tokens.token_create(name="sdk", tenant_id="ops")["token"]
    return token


@pytest.fixture
def client(web: str, api_key: str) -> Iterator[OpenAI]:
    with OpenAI(base_url=web + "/v1", api_key=api_key, max_retries=0, timeout=30) as sdk:
        yield sdk


def test_sdk_chat_completion(client: OpenAI) -> None:
    resp = client.chat.completions.create(
        model="mock/mock-generic", messages=[{"role": "user", "content": "hi"}], user="sdk-user", max_tokens=64
    )
    assert resp.choices[0].message.content == "ok" and resp.choices[0].finish_reason == "stop"
    assert resp.model == "mock-generic" and resp.id.startswith("chatcmpl-")
    assert resp.usage is not None and resp.usage.total_tokens == resp.usage.prompt_tokens
    row = wait_for(lambda: GatewayCall.objects.filter(user_id="sdk-user").first())
    assert row.status_code == 200 and row.endpoint == "chat.completions"


def test_sdk_stream_with_usage(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model="mock-generic",
        messages=[{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"loomcycle_provider": "mock"},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "ok"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0


def test_sdk_tool_call_round_trip(client: OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    first = client.chat.completions.create(model=TOOL_MODEL, messages=messages, tools=[WEATHER], tool_choice="auto")
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.tool_calls
    call = message.tool_calls[0]
    assert call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    messages += [message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    done = client.chat.completions.create(model=TOOL_MODEL, messages=messages, tools=[WEATHER])
    assert done.choices[0].message.content == "done"


def test_sdk_streamed_tool_call_accumulates(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=TOOL_MODEL,
        messages=[{"role": "user", "content": "weather?"}],
        tools=[WEATHER],
        stream=True,
    )
    deltas = [tc for c in stream for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1 and deltas[0].index == 0 and deltas[0].function is not None
    assert deltas[0].function.name == "get_weather"


def test_sdk_embeddings_default_base64_decode_to_the_float_vectors(client: OpenAI, web: str, api_key: str) -> None:
    texts = ["alpha beta", "gamma"]
    packed = client.embeddings.create(model="text-embedding-3-small", input=texts)  # the SDK asks for base64
    bearer = {"Authorization": f"Bearer {api_key}"}  # the token ended open mode
    floats = httpx.post(
        web + "/v1/embeddings", json={"input": texts, "encoding_format": "float"}, headers=bearer
    ).json()
    assert len(packed.data) == 2 and len(packed.data[0].embedding) == 384
    for got, want in zip(packed.data, floats["data"], strict=True):
        assert got.embedding == pytest.approx(want["embedding"], abs=1e-6)


def test_sdk_raises_status_errors_with_loomcycles_body(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="mock/mock-generic", messages=[{"role": "user", "content": "hi"}], n=2)
    assert bad.value.status_code == 400
    assert bad.value.body == "n: only 1 choice is supported"  # the SDK hands over body["error"]
    assert bad.value.response.json()["code"] == "bad_request"
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(
            model="mock/mock-generic?rate_500=1", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    assert failed.value.status_code == 502 and failed.value.response.json()["code"] == "provider_call_failed"


def test_langchain_invoke_stream_and_bind_tools(web: str, api_key: str) -> None:
    llm = ChatOpenAI(base_url=web + "/v1", api_key=api_key, model="mock/mock-generic", max_retries=0)  # type: ignore[arg-type]
    answer = llm.invoke("hi")
    assert isinstance(answer, AIMessage) and answer.content == "ok"
    chunks = list(llm.stream("hi"))
    assert "".join(str(c.content) for c in chunks) == "ok" and all(isinstance(c, AIMessageChunk) for c in chunks)

    tool_llm = ChatOpenAI(base_url=web + "/v1", api_key=api_key, model=FIRST_TOOL_MODEL, max_retries=0)  # type: ignore[arg-type]
    tooled = tool_llm.bind_tools([GetWeather])
    question = HumanMessage("weather in Paris?")
    asked = tooled.invoke([question])
    assert isinstance(asked, AIMessage) and asked.tool_calls[0]["name"] == "GetWeather"
    assert asked.tool_calls[0]["args"] == {"city": "Paris"}
    result = ToolMessage("sunny", tool_call_id=asked.tool_calls[0]["id"])
    assert tooled.invoke([question, asked, result]).content == "done"
