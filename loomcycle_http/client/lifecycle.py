"""`client.retention` (/v1/_retention: how long a tenant's ended runs are kept) and
`client.erasure` (/v1/_erasure: one person's data, reported or erased)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomcycle_http.client import _base as b

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client

Row = dict[str, Any]


def _only(**params: str | None) -> dict[str, Any] | None:
    return {k: v for k, v in params.items() if v is not None} or None


def retention_put(max_age_days: int, agent: str, tenant: str | None) -> b.Call:
    body = {"agent": agent, "max_age_days": max_age_days, **({"tenant": tenant} if tenant else {})}
    return b.Call("PUT", "/v1/_retention", json=body)


def erase_call(subject: str, dry_run: bool) -> b.Call:
    """A dry run reports; a real one names the subject twice (`confirm`), as the API requires."""
    body = {"subject": subject} if dry_run else {"subject": subject, "dry_run": False, "confirm": subject}
    return b.Call("POST", "/v1/_erasure", json=body)


class Retention:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("retention_get")
    def get(self, *, tenant: str | None = None) -> Row:
        """The ages in force (`default_days`, `policies`, `overrides`); an admin may name a `tenant`."""
        return dict(self._c.send(b.Call("GET", "/v1/_retention", params=_only(tenant=tenant))))

    @b.op("retention_put")
    def set(self, max_age_days: int, *, agent: str = "", tenant: str | None = None) -> Row:
        """The tenant's age in days (`agent`: one agent's; 0 keeps forever; an admin may name a `tenant`)."""
        return dict(self._c.send(retention_put(max_age_days, agent, tenant)))

    @b.op("retention_delete")
    def delete(self, *, agent: str = "", tenant: str | None = None) -> Row:
        """Remove an age set through the API (yaml's or the default applies again)."""
        return dict(self._c.send(b.Call("DELETE", "/v1/_retention", params=_only(agent=agent, tenant=tenant))))


class AsyncRetention:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("retention_get")
    async def get(self, *, tenant: str | None = None) -> Row:
        return dict(await self._c.send(b.Call("GET", "/v1/_retention", params=_only(tenant=tenant))))

    @b.op("retention_put")
    async def set(self, max_age_days: int, *, agent: str = "", tenant: str | None = None) -> Row:
        return dict(await self._c.send(retention_put(max_age_days, agent, tenant)))

    @b.op("retention_delete")
    async def delete(self, *, agent: str = "", tenant: str | None = None) -> Row:
        return dict(await self._c.send(b.Call("DELETE", "/v1/_retention", params=_only(agent=agent, tenant=tenant))))


class Erasure:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("erasure_get")
    def report(self, subject: str) -> Row:
        """What is held of the person `subject` (a user id of the caller's tenant), by tier."""
        return dict(self._c.send(b.Call("GET", "/v1/_erasure", params={"subject": subject})))

    @b.op("erasure_post")
    def erase(self, subject: str, *, dry_run: bool = True) -> Row:
        """The report as a dry run (`dry_run: true`), or, with `dry_run=False`, erase: the audit row."""
        return dict(self._c.send(erase_call(subject, dry_run)))


class AsyncErasure:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("erasure_get")
    async def report(self, subject: str) -> Row:
        return dict(await self._c.send(b.Call("GET", "/v1/_erasure", params={"subject": subject})))

    @b.op("erasure_post")
    async def erase(self, subject: str, *, dry_run: bool = True) -> Row:
        return dict(await self._c.send(erase_call(subject, dry_run)))
