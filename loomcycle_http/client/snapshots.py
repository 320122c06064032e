"""`client.snapshots`: the runtime's snapshots (/v1/_snapshots, admin): capture, list, read,
export, restore, delete."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomcycle_http.client import _base as b

if TYPE_CHECKING:
    from loomcycle_http.client.aio import AsyncClient
    from loomcycle_http.client.sync import Client

Row = dict[str, Any]
Rows = list[Row]  # (an alias: `list` is also a method name below)


def capture_call(label: str, max_bytes: int | None) -> b.Call:
    body = {"label": label, **({"max_bytes": max_bytes} if max_bytes is not None else {})}
    return b.Call("POST", "/v1/_snapshots", json=body)


def list_call(limit: int, label_contains: str) -> b.Call:
    params = {"limit": limit, **({"label_contains": label_contains} if label_contains else {})}
    return b.Call("GET", "/v1/_snapshots", params=params)


def one(snapshot_id: str, verb: str = "") -> str:
    return f"/v1/_snapshots/{b.seg(snapshot_id)}" + (f"/{verb}" if verb else "")


def restore_call(snapshot_id: str, envelope: Row | None) -> b.Call:
    """The stored envelope, or `envelope` inline (the path id is then not looked up)."""
    return b.Call("POST", one(snapshot_id, "restore"), json={} if envelope is None else {"json": envelope})


class Snapshots:
    def __init__(self, client: Client) -> None:
        self._c = client

    @b.op("snapshots_capture")
    def capture(self, *, label: str = "", max_bytes: int | None = None) -> Row:
        """Capture the runtime (its parked runs only when paused): the row, `runs_captured`, `runs_left_out`."""
        return dict(self._c.send(capture_call(label, max_bytes)))

    @b.op("snapshots_list")
    def list(self, *, limit: int = 100, label_contains: str = "") -> Rows:
        """Stored snapshots, newest first: id, created_at, label, schema_version, byte_size."""
        return list(self._c.send(list_call(limit, label_contains))["entries"])

    @b.op("snapshots_get")
    def get(self, snapshot_id: str) -> Row:
        """The snapshot's metadata and its `envelope` (GET /v1/_snapshots/{id})."""
        return dict(self._c.send(b.Call("GET", one(snapshot_id))))

    @b.op("snapshots_export")
    def export(self, snapshot_id: str) -> Row:
        """The envelope exactly as stored: what `restore(..., envelope=)` takes on another runtime."""
        return dict(self._c.send(b.Call("GET", one(snapshot_id, "export"))))

    @b.op("snapshots_restore")
    def restore(self, snapshot_id: str, *, envelope: Row | None = None) -> Row:
        """Restore the stored snapshot, or `envelope`: the counters of the rows written."""
        return dict(self._c.send(restore_call(snapshot_id, envelope)))

    @b.op("snapshots_delete")
    def delete(self, snapshot_id: str) -> None:
        self._c.send(b.Call("DELETE", one(snapshot_id)))


class AsyncSnapshots:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    @b.op("snapshots_capture")
    async def capture(self, *, label: str = "", max_bytes: int | None = None) -> Row:
        return dict(await self._c.send(capture_call(label, max_bytes)))

    @b.op("snapshots_list")
    async def list(self, *, limit: int = 100, label_contains: str = "") -> Rows:
        return list((await self._c.send(list_call(limit, label_contains)))["entries"])

    @b.op("snapshots_get")
    async def get(self, snapshot_id: str) -> Row:
        return dict(await self._c.send(b.Call("GET", one(snapshot_id))))

    @b.op("snapshots_export")
    async def export(self, snapshot_id: str) -> Row:
        return dict(await self._c.send(b.Call("GET", one(snapshot_id, "export"))))

    @b.op("snapshots_restore")
    async def restore(self, snapshot_id: str, *, envelope: Row | None = None) -> Row:
        return dict(await self._c.send(restore_call(snapshot_id, envelope)))

    @b.op("snapshots_delete")
    async def delete(self, snapshot_id: str) -> None:
        await self._c.send(b.Call("DELETE", one(snapshot_id)))
