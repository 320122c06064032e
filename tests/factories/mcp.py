"""An MCP SDK client over HTTP or stdio against the runtime's MCP server, and calling a tool with it."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx2
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests import procs

T = TypeVar("T")


Work = Callable[[Client], Awaitable[T]]


def over_http(base: str, headers: dict[str, str], work: Work[T]) -> T:
    """Run `work` with an SDK client connected to `base`/v1/_mcp with `headers`."""

    async def session() -> T:
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http:
            async with Client(streamable_http_client(base + "/v1/_mcp", http_client=http), cache=None) as client:
                return await work(client)

    return asyncio.run(session())


async def call(client: Client, name: str, args: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(is_error, body): the text content's JSON, which the structured content repeats."""
    result = await client.call_tool(name, args)
    body = json.loads(result.content[0].text)  # type: ignore[union-attr]
    assert result.structured_content == body
    return result.is_error, body


def script(*steps: dict[str, Any]) -> str:
    return f"Test prompt. MOCK_SCRIPT: {json.dumps(list(steps))}"


def over_stdio(argv: list[str], env: dict[str, str], work: Work[T]) -> T:
    """Run `work` with an SDK stdio client of `manage.py <argv>`."""
    params = StdioServerParameters(command=sys.executable, args=["manage.py", *argv], env=env, cwd=str(procs.ROOT))

    async def session() -> T:
        async with Client(params, cache=None) as client:
            return await work(client)

    return asyncio.run(session())
