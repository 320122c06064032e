"""`client.volumes` (POST /v1/_volumedef: a tenant's dynamic volumes) and `client.tokens`
(POST /v1/_operatortokendef, GET /v1/_operatortokendef/names: bearer tokens, admin only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomcycle_http.client import _base as b
from loomcycle_http.client.types import DefNames

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client

Row = dict[str, Any]
Rows = list[Row]  # (an alias: `list` is also a method name below)


def volume_call(op: str, name: str | None = None, mode: str | None = None) -> b.Call:
    body = {"op": op, **({"name": name} if name is not None else {}), **({"mode": mode} if mode else {})}
    return b.Call("POST", "/v1/_volumedef", json=body)


def token_call(op: str, fields: dict[str, Any]) -> b.Call:
    return b.Call(
        "POST", "/v1/_operatortokendef", json={"op": op, **{k: v for k, v in fields.items() if v is not None}}
    )


class Volumes:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("volumedef_op")
    def op(self, op: str, name: str | None = None, mode: str | None = None) -> Row:
        """`create` (mode `rw`/`ro`), `get`, `list`, `delete` (the files stay) or `purge` (the directory goes)."""
        return dict(self._c.send(volume_call(op, name, mode)))

    def list(self) -> Rows:
        return list(self.op("list")["volumes"])


class AsyncVolumes:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("volumedef_op")
    async def op(self, op: str, name: str | None = None, mode: str | None = None) -> Row:
        return dict(await self._c.send(volume_call(op, name, mode)))

    async def list(self) -> Rows:
        return list((await self.op("list"))["volumes"])


class Tokens:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("operator_token_names")
    def names(self) -> DefNames:
        return list(self._c.send(b.Call("GET", "/v1/_operatortokendef/names"))["names"])

    @b.op("operator_token_op")
    def op(self, op: str, **fields: Any) -> Row:
        """`create` (the answer's `token` is the secret, shown once), `rotate`, `retire`, `get`, `list`."""
        return dict(self._c.send(token_call(op, fields)))


class AsyncTokens:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("operator_token_names")
    async def names(self) -> DefNames:
        return list((await self._c.send(b.Call("GET", "/v1/_operatortokendef/names")))["names"])

    @b.op("operator_token_op")
    async def op(self, op: str, **fields: Any) -> Row:
        return dict(await self._c.send(token_call(op, fields)))
