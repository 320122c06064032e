"""`client.budgets`: token and cost limits (`/v1/_limits`) and the usage report
(`/v1/_usage`) of a runtime (issue 37)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import httpx

from loomcycle_http.client import _base as b
from loomcycle_http.client.errors import ConnectionFailed, error_from_response

if TYPE_CHECKING:
    from loomcycle_http.client.sync import Client


def _instant(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def usage_params(
    group_by: list[str], since: datetime | str | None, until: datetime | str | None, tenant: str | None
) -> dict[str, Any]:
    params = {"group_by": ",".join(group_by), "from": _instant(since), "to": _instant(until), "tenant": tenant}
    return {k: v for k, v in params.items() if v}


class Budgets:
    def __init__(self, client: Client) -> None:
        self._c = client

    def limits(self, *, tenant: str | None = None) -> list[dict[str, Any]]:
        """The limits the caller may see, each with its use this window."""
        params = {"tenant": tenant} if tenant else None
        return list(self._c.send(b.Call("GET", "/v1/_limits", params=params))["limits"])

    def set_limit(self, scope: str, scope_id: str = "", **fields: Any) -> dict[str, Any]:
        """Create or replace one limit: `soft_limit`, `hard_limit`, `kind`, `window`,
        `window_hours`, `on_exceed`, `tenant_id` (an absent threshold is cleared)."""
        body = {"scope": scope, "scope_id": scope_id, **{k: v for k, v in fields.items() if v is not None}}
        return dict(self._c.send(b.Call("PUT", "/v1/_limits", json=body))["limits"][0])

    def delete_limit(self, scope: str, scope_id: str = "", **fields: str | None) -> int:
        params = {"scope": scope, "scope_id": scope_id, **{k: v for k, v in fields.items() if v}}
        return int(self._c.send(b.Call("DELETE", "/v1/_limits", params=params))["deleted"])

    def usage(
        self,
        group_by: list[str],
        *,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """Tokens, calls and cost summed per group (tenant, user, agent, model, provider, day)."""
        params = usage_params(group_by, since, until, tenant)
        return dict(self._c.send(b.Call("GET", "/v1/_usage", params=params)))

    def usage_csv(
        self,
        group_by: list[str],
        *,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        tenant: str | None = None,
    ) -> str:
        params = {**usage_params(group_by, since, until, tenant), "format": "csv"}
        try:
            resp = self._c.http.get("/v1/_usage", params=params)
        except httpx.TransportError as exc:  # as Client.send reports it
            raise ConnectionFailed(f"GET {self._c.url}/v1/_usage: {exc!r}") from exc
        if resp.status_code >= 400:
            raise error_from_response(resp)
        return resp.text
