"""`client.config`: the runtime's embedded configuration units (GET /v1/_presets[/{name}], admin)
and its environment template (GET /v1/_env_template): what `manage.py presets` prints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomcycle_http.client import _base as b

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client

PRESETS = b.Call("GET", "/v1/_presets")
ENV_TEMPLATE = b.Call("GET", "/v1/_env_template")


def preset_call(name: str) -> b.Call:
    return b.Call("GET", f"/v1/_presets/{b.seg(name)}")


class Config:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("presets_list")
    def presets(self) -> list[dict[str, Any]]:
        """The presets and bundles LOOMCYCLE_PRESETS selects from: `{name, kind, description}` each."""
        return list(self._c.send(PRESETS)["units"])

    @b.op("presets_show")
    def preset(self, name: str) -> str:
        """One unit's yaml, as it is layered (404 `unknown_preset`)."""
        return str(self._c.send(preset_call(name))["yaml"])

    @b.op("env_template")
    def env_template(self) -> str:
        """Every non-secret environment variable the runtime reads, commented out with its default."""
        return str(self._c.send(ENV_TEMPLATE)["env"])


class AsyncConfig:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("presets_list")
    async def presets(self) -> list[dict[str, Any]]:
        return list((await self._c.send(PRESETS))["units"])

    @b.op("presets_show")
    async def preset(self, name: str) -> str:
        return str((await self._c.send(preset_call(name)))["yaml"])

    @b.op("env_template")
    async def env_template(self) -> str:
        return str((await self._c.send(ENV_TEMPLATE))["env"])
