"""`client.memory`: memory rows of the caller's tenant (scopes agent, user, tenant, global;
/v1/_memory)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from loomcycle_http.client import _base as b
from loomcycle_http.client.types import MemoryEntries, MemoryPut, MemorySearch

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client


def keys_call(scope: str, scope_id: str, prefix: str, limit: int) -> b.Call:
    path = b.memory_key_path(scope, scope_id, "").rstrip("/")
    return b.Call("GET", path, params={"prefix": prefix, "limit": limit})


SCOPES = b.Call("GET", "/v1/_memory/scopes")


class Memory:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("memory_key_get")
    def get(self, scope: str, scope_id: str, key: str) -> Any:
        """The entry's value; NotFound when the key is absent."""
        return self._c.send(b.Call("GET", b.memory_key_path(scope, scope_id, key)))["entry"]["value"]

    @b.op("memory_key_put")
    def set(
        self, scope: str, scope_id: str, key: str, value: Any, *, ttl_seconds: int | None = None, embed: bool = False
    ) -> MemoryPut:
        call = b.memory_set_call(scope, scope_id, key, value, ttl_seconds=ttl_seconds, embed=embed)
        return cast(MemoryPut, self._c.send(call))

    @b.op("memory_keys_list")
    def keys(self, scope: str, scope_id: str, *, prefix: str = "", limit: int = 200) -> MemoryEntries:
        """Live keys of the slot, with their values (GET .../keys; `limit` at most 1000)."""
        return list(self._c.send(keys_call(scope, scope_id, prefix, limit))["entries"])

    @b.op("memory_key_delete")
    def delete(self, scope: str, scope_id: str, key: str) -> None:
        self._c.send(b.Call("DELETE", b.memory_key_path(scope, scope_id, key)))

    @b.op("memory_search")
    def search(self, query: str, *, scope: str, scope_id: str = "", top_k: int = 5) -> MemorySearch:
        """Semantic search over the slot's embedded rows (POST /v1/_memory/search)."""
        return cast(MemorySearch, self._c.send(b.memory_search_call(query, scope, scope_id, top_k)))

    @b.op("memory_scopes")
    def scopes(self) -> list[str]:
        """The memory scopes this runtime has (GET /v1/_memory/scopes)."""
        return [str(s) for s in self._c.send(SCOPES)["scopes"]]


class AsyncMemory:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("memory_key_get")
    async def get(self, scope: str, scope_id: str, key: str) -> Any:
        return (await self._c.send(b.Call("GET", b.memory_key_path(scope, scope_id, key))))["entry"]["value"]

    @b.op("memory_key_put")
    async def set(
        self, scope: str, scope_id: str, key: str, value: Any, *, ttl_seconds: int | None = None, embed: bool = False
    ) -> MemoryPut:
        call = b.memory_set_call(scope, scope_id, key, value, ttl_seconds=ttl_seconds, embed=embed)
        return cast(MemoryPut, await self._c.send(call))

    @b.op("memory_keys_list")
    async def keys(self, scope: str, scope_id: str, *, prefix: str = "", limit: int = 200) -> MemoryEntries:
        return list((await self._c.send(keys_call(scope, scope_id, prefix, limit)))["entries"])

    @b.op("memory_key_delete")
    async def delete(self, scope: str, scope_id: str, key: str) -> None:
        await self._c.send(b.Call("DELETE", b.memory_key_path(scope, scope_id, key)))

    @b.op("memory_search")
    async def search(self, query: str, *, scope: str, scope_id: str = "", top_k: int = 5) -> MemorySearch:
        return cast(MemorySearch, await self._c.send(b.memory_search_call(query, scope, scope_id, top_k)))

    @b.op("memory_scopes")
    async def scopes(self) -> list[str]:
        return [str(s) for s in (await self._c.send(SCOPES))["scopes"]]
