"""`client.agents`: agent definitions (the substrate's AgentDef, /v1/_agentdef): names, versions,
the active version, `apply`, and the def ops themselves (`op`, shared with every def kind)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomcycle_http.client import _base as b
from loomcycle_http.client.defs import AsyncDefs, Defs
from loomcycle_http.client.errors import NotFound
from loomcycle_http.client.types import DefNames

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client


def _missing(name: str) -> NotFound:
    return NotFound(404, "not_found", f"no agent named {name!r}", {}, None)


class Agents(Defs):
    """The def ops of `Defs` (`names`, `op`, `create`, `fork`, `get_def`, ...) plus what the CLI uses."""

    def __init__(self, client: Client) -> None:
        super().__init__(client, "agent")

    @b.op("agentdef_names")
    def list(self) -> DefNames:
        """Every agent name the caller sees, with its version count and whether it is static."""
        return self.names()

    def get(self, name: str) -> dict[str, Any]:
        """The active version of `name` (def_id, version, content_sha256, definition, ...)."""
        row = b.active_row(name, self.names(), self.versions(name))
        if row is None:
            raise _missing(name)
        return row

    @b.op("agentdef_op", "me")
    def apply(self, name: str, definition: dict[str, Any], *, description: str = "") -> dict[str, Any]:
        """Make `definition` the active version of `name`: a fork of a static yaml entry,
        else a create (identical content returns the active row, `deduplicated: true`). A static
        name is refused in the shared tenant (LoomcycleError `static_in_shared_tenant`): there
        the yaml entry outranks every runtime version."""
        static = any(row.get("name") == name and row.get("static") for row in self.names())
        if static:
            b.check_apply_tenant(name, self._c.send(b.Call("GET", "/v1/_me")))
        call = b.agent_apply_call(name, definition, static=static, description=description)
        return dict(self._c.send(call))


class AsyncAgents(AsyncDefs):
    """`Agents`, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        super().__init__(client, "agent")

    @b.op("agentdef_names")
    async def list(self) -> DefNames:
        return await self.names()

    async def get(self, name: str) -> dict[str, Any]:
        row = b.active_row(name, await self.names(), await self.versions(name))
        if row is None:
            raise _missing(name)
        return row

    @b.op("agentdef_op", "me")
    async def apply(self, name: str, definition: dict[str, Any], *, description: str = "") -> dict[str, Any]:
        static = any(row.get("name") == name and row.get("static") for row in await self.names())
        if static:
            b.check_apply_tenant(name, await self._c.send(b.Call("GET", "/v1/_me")))
        call = b.agent_apply_call(name, definition, static=static, description=description)
        return dict(await self._c.send(call))
