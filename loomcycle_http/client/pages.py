"""Iterators over the API's cursor-paginated lists (GET /v1/runs, /v1/runs/{id}/children,
/v1/sessions): each page's `next_cursor` is sent back as `cursor` until it is "" (docs/client.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from loomcycle_http.client import _base as b

RUNS_PAGE = 100  # the server's default page of GET /v1/runs and children
SESSIONS_PAGE = 50  # the server's default page of GET /v1/sessions


def _params(filters: dict[str, Any], limit: int) -> dict[str, Any]:
    return {**{k: v for k, v in filters.items() if v not in (None, "")}, "limit": limit}


def paged(send: Callable[[b.Call], Any], path: str, key: str, params: dict[str, Any]) -> Iterator[Any]:
    """Every row of `key` over the pages of GET `path`, one request per page, as the caller iterates."""
    cursor = ""
    while True:
        page = send(b.Call("GET", path, params={**params, **({"cursor": cursor} if cursor else {})}))
        yield from page[key]
        cursor = str(page.get("next_cursor") or "")
        if not cursor:
            return


async def apaged(
    send: Callable[[b.Call], Awaitable[Any]], path: str, key: str, params: dict[str, Any]
) -> AsyncIterator[Any]:
    """`paged`, awaited."""
    cursor = ""
    while True:
        page = await send(b.Call("GET", path, params={**params, **({"cursor": cursor} if cursor else {})}))
        for row in page[key]:
            yield row
        cursor = str(page.get("next_cursor") or "")
        if not cursor:
            return


def runs_query(page_size: int, **filters: Any) -> tuple[str, str, dict[str, Any]]:
    """GET /v1/runs with its filters (status, agent, user_id, metadata JSON, created_after/before, tenant)."""
    return "/v1/runs", "runs", _params(filters, page_size)


def children_query(run_id: str, status: str, page_size: int) -> tuple[str, str, dict[str, Any]]:
    return f"/v1/runs/{b.seg(run_id)}/children", "agents", _params({"status": status}, page_size)


def sessions_query(page_size: int, **filters: Any) -> tuple[str, str, dict[str, Any]]:
    """GET /v1/sessions with its filters (user_id, agent, metadata JSON, active_after/before)."""
    return "/v1/sessions", "sessions", _params(filters, page_size)
