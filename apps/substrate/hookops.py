"""ScheduleDef's own ops beyond the shared ones (SPEC 6.9): `add_hook` and `remove_hook`, each
a fork of the def with its `on_complete` list edited. They are services over `def_get` and
`def_fork`, registered with `services.def_ops_register` from SubstrateConfig.ready(), so the
services, which dispatch them, never import this module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apps.substrate import services
from apps.substrate.kinds import Kind, Refused
from apps.substrate.kinds.triggers import check_hook


def _hook_edit(
    kind: Kind, author: Any, data: dict[str, Any], op: str, edit: Callable[[list[Any]], str]
) -> dict[str, Any]:
    """Fork `def_id` with its hook list edited: a new, promoted version whose parent is `def_id`."""
    def_id = _def_id(data, op)
    try:
        current = services.def_get(kind, author, {"def_id": def_id})
    except Refused as exc:
        raise Refused(f"{op}:{exc.message.split(':', 1)[1]}") from exc
    hooks = list(current["definition"].get("on_complete") or [])
    summary = edit(hooks)
    body = {
        "name": current["name"],
        "parent_def_id": def_id,
        "overlay": {"on_complete": hooks},
        "description": data.get("description") or summary,
        "promote": data.get("promote"),
    }
    return services.def_fork(kind, author, body)


def _def_id(data: dict[str, Any], op: str) -> str:
    def_id = data.get("def_id")
    if not isinstance(def_id, str) or not def_id:
        raise Refused(f"{op}: missing required field: def_id")
    return def_id


def schedule_add_hook(kind: Kind, author: Any, data: dict[str, Any]) -> dict[str, Any]:
    _def_id(data, "add_hook")
    hook = check_hook(data.get("hook"), "add_hook: hook", strict=True)

    def add(hooks: list[Any]) -> str:
        hooks.append(hook)
        return f"add_hook: {hook['kind']}"

    return _hook_edit(kind, author, data, "add_hook", add)


def schedule_remove_hook(kind: Kind, author: Any, data: dict[str, Any]) -> dict[str, Any]:
    _def_id(data, "remove_hook")
    index = data.get("hook_index")
    if not isinstance(index, int) or isinstance(index, bool):
        raise Refused("remove_hook: missing required field: hook_index (an integer)")

    def remove(hooks: list[Any]) -> str:
        if not 0 <= index < len(hooks):
            raise Refused(f"remove_hook: hook_index {index} is out of range (the def has {len(hooks)} hook(s))")
        removed = hooks.pop(index)
        return f"remove_hook: {removed.get('kind')} at {index}"

    return _hook_edit(kind, author, data, "remove_hook", remove)


SCHEDULE_OPS: dict[str, services.DefOp] = {"add_hook": schedule_add_hook, "remove_hook": schedule_remove_hook}
