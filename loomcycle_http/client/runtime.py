"""`client.runtime`: the runtime-wide pause (admin), the calling principal (GET /v1/_me) and the
live fairness slots (GET /v1/_concurrency/stats, admin)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomcycle_http.client import _base as b

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client

Row = dict[str, Any]


def pause_call(timeout_ms: int | None) -> tuple[b.Call, float]:
    """The call and how long to wait for its answer (the pause waits up to `timeout_ms` for runs to park)."""
    body = {} if timeout_ms is None else {"timeout_ms": timeout_ms}
    return b.Call("POST", "/v1/_pause", json=body), (timeout_ms or 30_000) / 1000 + 30


RESUME = b.Call("POST", "/v1/_resume", json={})
STATE = b.Call("GET", "/v1/_state")
ME = b.Call("GET", "/v1/_me")
CONCURRENCY = b.Call("GET", "/v1/_concurrency/stats")


class Runtime:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("runtime_pause")
    def pause(self, timeout_ms: int | None = None) -> Row:
        call, timeout = pause_call(timeout_ms)
        return dict(self._c.send(call, timeout=timeout))

    @b.op("runtime_resume")
    def resume(self) -> Row:
        return dict(self._c.send(RESUME))

    @b.op("runtime_state")
    def state(self) -> Row:
        return dict(self._c.send(STATE))

    @b.op("me")
    def me(self) -> Row:
        """The calling principal: `tenant_id`, `subject`, `scopes`, `is_admin`, `capabilities`, ..."""
        return dict(self._c.send(ME))

    @b.op("concurrency_stats")
    def concurrency(self) -> Row:
        """Live runs and the fairness slots held per user, tenant and provider, across the cluster."""
        return dict(self._c.send(CONCURRENCY))


class AsyncRuntime:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("runtime_pause")
    async def pause(self, timeout_ms: int | None = None) -> Row:
        call, timeout = pause_call(timeout_ms)
        return dict(await self._c.send(call, timeout=timeout))

    @b.op("runtime_resume")
    async def resume(self) -> Row:
        return dict(await self._c.send(RESUME))

    @b.op("runtime_state")
    async def state(self) -> Row:
        return dict(await self._c.send(STATE))

    @b.op("me")
    async def me(self) -> Row:
        return dict(await self._c.send(ME))

    @b.op("concurrency_stats")
    async def concurrency(self) -> Row:
        return dict(await self._c.send(CONCURRENCY))
