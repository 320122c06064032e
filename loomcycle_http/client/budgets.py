"""`client.budgets`: token and cost limits (`/v1/_limits`) and the usage report
(`/v1/_usage`) of a runtime (issue 37)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import httpx

from loomcycle_http.client import _base as b
from loomcycle_http.client.errors import ConnectionFailed, error_from_response

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client

Row = dict[str, Any]
Instant = datetime | str | None


def _instant(value: Instant) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def usage_params(group_by: list[str], since: Instant, until: Instant, tenant: str | None) -> dict[str, Any]:
    params = {"group_by": ",".join(group_by), "from": _instant(since), "to": _instant(until), "tenant": tenant}
    return {k: v for k, v in params.items() if v}


def limits_call(tenant: str | None) -> b.Call:
    return b.Call("GET", "/v1/_limits", params={"tenant": tenant} if tenant else None)


def set_limit_call(scope: str, scope_id: str, fields: dict[str, Any]) -> b.Call:
    body = {"scope": scope, "scope_id": scope_id, **{k: v for k, v in fields.items() if v is not None}}
    return b.Call("PUT", "/v1/_limits", json=body)


def delete_limit_call(scope: str, scope_id: str, fields: dict[str, str | None]) -> b.Call:
    return b.Call(
        "DELETE", "/v1/_limits", params={"scope": scope, "scope_id": scope_id, **{k: v for k, v in fields.items() if v}}
    )


def csv_text(resp: httpx.Response) -> str:
    if resp.status_code >= 400:
        raise error_from_response(resp)
    return resp.text


class Budgets:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("limits_list")
    def limits(self, *, tenant: str | None = None) -> list[Row]:
        """The limits the caller may see, each with its use this window."""
        return list(self._c.send(limits_call(tenant))["limits"])

    @b.op("limits_put")
    def set_limit(self, scope: str, scope_id: str = "", **fields: Any) -> Row:
        """Create or replace one limit: `soft_limit`, `hard_limit`, `kind`, `window`,
        `window_hours`, `on_exceed`, `tenant_id` (an absent threshold is cleared)."""
        return dict(self._c.send(set_limit_call(scope, scope_id, fields))["limits"][0])

    @b.op("limits_delete")
    def delete_limit(self, scope: str, scope_id: str = "", **fields: str | None) -> int:
        return int(self._c.send(delete_limit_call(scope, scope_id, fields))["deleted"])

    @b.op("usage_report")
    def usage(
        self, group_by: list[str], *, since: Instant = None, until: Instant = None, tenant: str | None = None
    ) -> Row:
        """Tokens, calls and cost summed per group (tenant, user, agent, model, provider, day)."""
        return dict(self._c.send(b.Call("GET", "/v1/_usage", params=usage_params(group_by, since, until, tenant))))

    @b.op("usage_report")
    def usage_csv(
        self, group_by: list[str], *, since: Instant = None, until: Instant = None, tenant: str | None = None
    ) -> str:
        params = {**usage_params(group_by, since, until, tenant), "format": "csv"}
        try:
            resp = self._c.http.get("/v1/_usage", params=params)
        except httpx.TransportError as exc:  # as Client.send reports it
            raise ConnectionFailed(f"GET {self._c.url}/v1/_usage: {exc!r}") from exc
        return csv_text(resp)


class AsyncBudgets:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("limits_list")
    async def limits(self, *, tenant: str | None = None) -> list[Row]:
        return list((await self._c.send(limits_call(tenant)))["limits"])

    @b.op("limits_put")
    async def set_limit(self, scope: str, scope_id: str = "", **fields: Any) -> Row:
        return dict((await self._c.send(set_limit_call(scope, scope_id, fields)))["limits"][0])

    @b.op("limits_delete")
    async def delete_limit(self, scope: str, scope_id: str = "", **fields: str | None) -> int:
        return int((await self._c.send(delete_limit_call(scope, scope_id, fields)))["deleted"])

    @b.op("usage_report")
    async def usage(
        self, group_by: list[str], *, since: Instant = None, until: Instant = None, tenant: str | None = None
    ) -> Row:
        return dict(
            await self._c.send(b.Call("GET", "/v1/_usage", params=usage_params(group_by, since, until, tenant)))
        )

    @b.op("usage_report")
    async def usage_csv(
        self, group_by: list[str], *, since: Instant = None, until: Instant = None, tenant: str | None = None
    ) -> str:
        params = {**usage_params(group_by, since, until, tenant), "format": "csv"}
        try:
            resp = await self._c.http.get("/v1/_usage", params=params)
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"GET {self._c.url}/v1/_usage: {exc!r}") from exc
        return csv_text(resp)
