"""`client.snapshots`: the runtime's snapshots (/v1/_snapshots, admin): capture, list, read, delete."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loomcycle_http.client import _base as b

if TYPE_CHECKING:
    from loomcycle_http.client.sync import Client

Rows = list[dict[str, Any]]  # (an alias: `list` is also a method name below)


class Snapshots:
    def __init__(self, client: Client) -> None:
        self._c = client

    def capture(self, *, label: str = "", max_bytes: int | None = None) -> dict[str, Any]:
        """Capture the runtime (its parked runs only when paused): the row, `runs_captured`, `runs_left_out`."""
        body = {"label": label, **({"max_bytes": max_bytes} if max_bytes is not None else {})}
        return dict(self._c.send(b.Call("POST", "/v1/_snapshots", json=body)))

    def list(self, *, limit: int = 100, label_contains: str = "") -> Rows:
        """Stored snapshots, newest first: id, created_at, label, schema_version, byte_size."""
        params = {"limit": limit, **({"label_contains": label_contains} if label_contains else {})}
        return list(self._c.send(b.Call("GET", "/v1/_snapshots", params=params))["entries"])

    def get(self, snapshot_id: str) -> dict[str, Any]:
        """The snapshot's metadata and its `envelope` (GET /v1/_snapshots/{id})."""
        return dict(self._c.send(b.Call("GET", f"/v1/_snapshots/{b.seg(snapshot_id)}")))

    def delete(self, snapshot_id: str) -> None:
        self._c.send(b.Call("DELETE", f"/v1/_snapshots/{b.seg(snapshot_id)}"))
