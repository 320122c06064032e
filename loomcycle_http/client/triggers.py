"""`client.hooks` (tool-use hooks, /v1/hooks), `client.schedules` (the scheduler's view of
ScheduleDefs, /v1/_schedules) and `client.webhooks` (inbound webhooks' admin routes,
/v1/_webhooks/{name}/...). The definitions themselves are `client.schedule_defs` and
`client.webhook_defs` (loomcycle_http.client.defs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomcycle_http.client import _base as b

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client

Row = dict[str, Any]
Rows = list[Row]  # (an alias: `list` is also a method name below)
HOOKS = b.Call("GET", "/v1/hooks")


def hook_call(owner: str, name: str, phase: str, callback_url: str, fields: dict[str, Any]) -> b.Call:
    """POST /v1/hooks: `agents`, `tools`, `fail_mode`, `timeout_ms` besides the required fields."""
    body = {"owner": owner, "name": name, "phase": phase, "callback_url": callback_url, **fields}
    return b.Call("POST", "/v1/hooks", json=body)


def schedule_call(def_id: str, verb: str) -> b.Call:
    return b.Call("GET" if verb == "state" else "POST", f"/v1/_schedules/{b.seg(def_id)}/{verb}")


def list_all_call(tenant: str | None) -> b.Call:
    return b.Call("GET", "/v1/_schedules/list-all", params={"tenant": tenant} if tenant else None)


def deliveries_call(name: str, limit: int) -> b.Call:
    return b.Call("GET", f"/v1/_webhooks/{b.seg(name)}/recent-deliveries", params={"limit": limit})


def test_call(name: str, payload: Any, tenant: str | None) -> b.Call:
    return b.Call(
        "POST", f"/v1/_webhooks/{b.seg(name)}/test", json=payload, params={"tenant": tenant} if tenant else None
    )


class Hooks:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("hooks_register")
    def register(self, owner: str, name: str, phase: str, callback_url: str, **fields: Any) -> str:
        """Register (or replace, by `(owner, name)`) a hook; its new id."""
        return str(self._c.send(hook_call(owner, name, phase, callback_url, fields))["id"])

    @b.op("hooks_list")
    def list(self) -> Rows:
        """The caller's tenant's hooks (an admin's: every tenant's), in chain order."""
        return list(self._c.send(HOOKS)["hooks"])

    @b.op("hooks_delete")
    def delete(self, hook_id: str) -> None:
        self._c.send(b.Call("DELETE", f"/v1/hooks/{b.seg(hook_id)}"))


class AsyncHooks:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("hooks_register")
    async def register(self, owner: str, name: str, phase: str, callback_url: str, **fields: Any) -> str:
        return str((await self._c.send(hook_call(owner, name, phase, callback_url, fields)))["id"])

    @b.op("hooks_list")
    async def list(self) -> Rows:
        return list((await self._c.send(HOOKS))["hooks"])

    @b.op("hooks_delete")
    async def delete(self, hook_id: str) -> None:
        await self._c.send(b.Call("DELETE", f"/v1/hooks/{b.seg(hook_id)}"))


class Schedules:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("schedules_list_all")
    def list(self, *, tenant: str | None = None) -> Rows:
        """The active version of every schedule of the caller's tenant (an admin: every tenant, or `tenant`)."""
        return list(self._c.send(list_all_call(tenant))["entries"])

    @b.op("schedule_state")
    def state(self, def_id: str) -> Row:
        return dict(self._c.send(schedule_call(def_id, "state")))

    @b.op("schedule_run_now")
    def run_now(self, def_id: str) -> Row:
        """The next tick fires it: `{def_id, scheduled: "next-tick"}`."""
        return dict(self._c.send(schedule_call(def_id, "run-now")))

    @b.op("schedule_pause")
    def pause(self, def_id: str) -> Row:
        return dict(self._c.send(schedule_call(def_id, "pause")))

    @b.op("schedule_resume")
    def resume(self, def_id: str) -> Row:
        return dict(self._c.send(schedule_call(def_id, "resume")))


class AsyncSchedules:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("schedules_list_all")
    async def list(self, *, tenant: str | None = None) -> Rows:
        return list((await self._c.send(list_all_call(tenant)))["entries"])

    @b.op("schedule_state")
    async def state(self, def_id: str) -> Row:
        return dict(await self._c.send(schedule_call(def_id, "state")))

    @b.op("schedule_run_now")
    async def run_now(self, def_id: str) -> Row:
        return dict(await self._c.send(schedule_call(def_id, "run-now")))

    @b.op("schedule_pause")
    async def pause(self, def_id: str) -> Row:
        return dict(await self._c.send(schedule_call(def_id, "pause")))

    @b.op("schedule_resume")
    async def resume(self, def_id: str) -> Row:
        return dict(await self._c.send(schedule_call(def_id, "resume")))


class Webhooks:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("webhooks_recent_deliveries")
    def deliveries(self, name: str, *, limit: int = 50) -> Rows:
        """The webhook's recent deliveries, newest first (admin)."""
        return list(self._c.send(deliveries_call(name, limit))["deliveries"])

    @b.op("webhooks_test")
    def test(self, name: str, payload: Any, *, tenant: str | None = None) -> Row:
        """Dry-run a delivery of `payload` (admin): `{would_accept, verdict, run_input_preview, ...}`."""
        return dict(self._c.send(test_call(name, payload, tenant)))


class AsyncWebhooks:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("webhooks_recent_deliveries")
    async def deliveries(self, name: str, *, limit: int = 50) -> Rows:
        return list((await self._c.send(deliveries_call(name, limit)))["deliveries"])

    @b.op("webhooks_test")
    async def test(self, name: str, payload: Any, *, tenant: str | None = None) -> Row:
        return dict(await self._c.send(test_call(name, payload, tenant)))
