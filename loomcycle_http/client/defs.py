"""Versioned substrate definitions (POST /v1/_{kind}def, GET /v1/_{kind}def/names; docs/api.md,
"Substrate definitions"): one `Defs` per kind (`agent`, `skill`, `mcpserver`, `schedule`,
`webhook`, `a2aservercard`, `a2aagent`), each op one request. `op` sends any op as the API
takes it; the named methods are its common uses. Op ids in `b.op` tags name the kind as
`{kind}` (the resource's `kind`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomcycle_http.client import _base as b
from loomcycle_http.client.types import DefNames

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client

Row = dict[str, Any]
KINDS = ("agent", "skill", "mcpserver", "schedule", "webhook", "a2aservercard", "a2aagent")


def op_call(kind: str, op: str, fields: dict[str, Any]) -> b.Call:
    """One op of `kind`; None-valued fields are left out (the API's defaults apply)."""
    return b.Call("POST", f"/v1/_{kind}def", json={"op": op, **{k: v for k, v in fields.items() if v is not None}})


def names_call(kind: str) -> b.Call:
    return b.Call("GET", f"/v1/_{kind}def/names")


def write_fields(overlay: dict[str, Any] | None, description: str, promote: bool | None) -> dict[str, Any]:
    return {"overlay": overlay, "description": description or None, "promote": promote}


class Defs:
    """The definitions of one kind, as the caller's tenant sees them."""

    def __init__(self, client: Client, kind: str) -> None:
        self._c, self.kind = client, kind

    @b.op("{kind}def_names")
    def names(self) -> DefNames:
        """Every name with its version count, active version and whether it is static."""
        return list(self._c.send(names_call(self.kind))["names"])

    @b.op("{kind}def_op")
    def op(self, op: str, **fields: Any) -> Row:
        """Any op with its input (`create`, `fork`, `get`, `list`, `retire`, `promote`, `verify`, `rediscover`)."""
        return dict(self._c.send(op_call(self.kind, op, fields)))

    def create(
        self, name: str, overlay: dict[str, Any], *, description: str = "", promote: bool | None = None, **fields: Any
    ) -> Row:
        """A new version of a runtime name (identical content: the active row, `deduplicated: true`)."""
        return self.op("create", name=name, **write_fields(overlay, description, promote), **fields)

    def fork(
        self,
        name: str,
        overlay: dict[str, Any] | None = None,
        *,
        parent_def_id: str | None = None,
        description: str = "",
        promote: bool | None = None,
        **fields: Any,
    ) -> Row:
        """A version merged onto `parent_def_id` (default: the active one, else the yaml entry)."""
        extra = {"parent_def_id": parent_def_id, **write_fields(overlay, description, promote), **fields}
        return self.op("fork", name=name, **extra)

    def version(self, def_id: str) -> Row:
        """One version by its def_id (`promoted` says whether it is active)."""
        return self.op("get", def_id=def_id)

    def versions(self, name: str) -> list[Row]:
        """Every version of `name`, newest first."""
        return list(self.op("list", name=name)["versions"])

    def retire(self, def_id: str, retired: bool = True) -> Row:
        return self.op("retire", def_id=def_id, retired=retired)

    def promote(self, def_id: str) -> Row:
        return self.op("promote", def_id=def_id)

    def verify(self, name: str, content_sha256: str) -> Row:
        """Whether `content_sha256` is the active content of `name`: `{matches, current_sha256, ...}`."""
        return self.op("verify", name=name, content_sha256=content_sha256)


class AsyncDefs:
    """`Defs`, awaited."""

    def __init__(self, client: AsyncClient, kind: str) -> None:
        self._c, self.kind = client, kind

    @b.op("{kind}def_names")
    async def names(self) -> DefNames:
        return list((await self._c.send(names_call(self.kind)))["names"])

    @b.op("{kind}def_op")
    async def op(self, op: str, **fields: Any) -> Row:
        return dict(await self._c.send(op_call(self.kind, op, fields)))

    async def create(
        self, name: str, overlay: dict[str, Any], *, description: str = "", promote: bool | None = None, **fields: Any
    ) -> Row:
        return await self.op("create", name=name, **write_fields(overlay, description, promote), **fields)

    async def fork(
        self,
        name: str,
        overlay: dict[str, Any] | None = None,
        *,
        parent_def_id: str | None = None,
        description: str = "",
        promote: bool | None = None,
        **fields: Any,
    ) -> Row:
        extra = {"parent_def_id": parent_def_id, **write_fields(overlay, description, promote), **fields}
        return await self.op("fork", name=name, **extra)

    async def version(self, def_id: str) -> Row:
        return await self.op("get", def_id=def_id)

    async def versions(self, name: str) -> list[Row]:
        return list((await self.op("list", name=name))["versions"])

    async def retire(self, def_id: str, retired: bool = True) -> Row:
        return await self.op("retire", def_id=def_id, retired=retired)

    async def promote(self, def_id: str) -> Row:
        return await self.op("promote", def_id=def_id)

    async def verify(self, name: str, content_sha256: str) -> Row:
        return await self.op("verify", name=name, content_sha256=content_sha256)
