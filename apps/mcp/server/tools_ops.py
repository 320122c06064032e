"""The rest of loomcycle's MCP meta-tools whose capability this runtime has, under
loomcycle's names and input shapes, each calling what its REST route calls:

- `scheduledef`, `webhookdef`, `a2aservercarddef`, `a2aagentdef` (`POST /v1/_scheduledef`,
  `/v1/_webhookdef`, `/v1/_a2aservercarddef`, `/v1/_a2aagentdef`; substrate:tenant)
  and `operatortokendef` (`POST /v1/_operatortokendef`; substrate:admin);
- the six snapshot tools (`/v1/_snapshots...`; substrate:admin: a snapshot spans tenants);
- `register_hook` / `list_hooks` / `delete_hook` (`/v1/hooks`; substrate:tenant);
- `pause_runtime` / `resume_runtime` / `get_runtime_state`, loomcycle's names of `pause` /
  `resume` / `state` (kept too).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from apps.core.http import db_call
from apps.core.ids import IDENT_RE
from apps.core.types import Principal
from apps.mcp.server.tools_admin import DefRefused, NoArgs, PauseArgs, def_tool, pause, resume, state
from apps.mcp.server.tooltable import Args, McpTool, register
from apps.snapshots import presenters, selectors, services
from apps.substrate import tokens
from apps.substrate.auth import ADMIN, TENANT
from apps.substrate.kinds import Refused
from apps.triggers.hooks import presenters as hook_presenters
from apps.triggers.hooks import selectors as hook_selectors
from apps.triggers.hooks import services as hooks

_SNAPSHOT_ID = Field(pattern=f"^{IDENT_RE.pattern}$", description="the snapshot's id")


# --- operator tokens -------------------------------------------------------------------


class TokenOpArgs(Args):
    """`{op, ...}` as POST /v1/_operatortokendef takes it (the service checks every field)."""

    model_config = ConfigDict(extra="allow")
    op: str = Field(description="create | rotate | retire | get | list")


def _token_op(principal: Principal, args: TokenOpArgs) -> dict[str, Any]:
    try:
        return tokens.token_dispatch(args.model_dump(exclude_unset=True), by=principal.subject)
    except Refused as exc:
        raise DefRefused(exc, tokens.TOOL) from exc


async def operatortokendef(principal: Principal, args: TokenOpArgs) -> dict[str, Any]:
    return await db_call(_token_op)(principal, args)


# --- snapshots -------------------------------------------------------------------------


class CreateSnapshotArgs(Args):
    description: str = Field(default="", max_length=256, description="stored as the snapshot's label")
    max_bytes: int | None = Field(default=None, ge=1024, description="at most LOOMCYCLE_SNAPSHOT_MAX_BYTES")
    include_history: Literal[False] = Field(default=False, description="interaction history is not built here")


class SnapshotArgs(Args):
    snapshot_id: str = _SNAPSHOT_ID


class RestoreSnapshotArgs(Args):
    snapshot_id: str | None = Field(default=None, pattern=f"^{IDENT_RE.pattern}$")
    raw_json: dict[str, Any] | None = Field(default=None, description="an envelope (export_snapshot's raw_json)")
    include_history: Literal[False] = False

    @model_validator(mode="after")
    def _one_source(self) -> RestoreSnapshotArgs:
        if (self.snapshot_id is None) == (self.raw_json is None):
            raise ValueError("give snapshot_id or raw_json, one of them")
        return self


def _create_snapshot(args: CreateSnapshotArgs) -> dict[str, Any]:
    return presenters.snapshot_captured_out(services.snapshot_take(label=args.description, max_bytes=args.max_bytes))


def _list_snapshots() -> dict[str, Any]:
    return {"entries": [presenters.snapshot_out(row) for row in selectors.snapshot_list(limit=200)]}


def _get_snapshot(args: SnapshotArgs) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(
        presenters.snapshot_with_envelope(selectors.snapshot_get(snapshot_id=args.snapshot_id))
    )
    return body


def _export_snapshot(args: SnapshotArgs) -> dict[str, Any]:
    return {
        "snapshot_id": args.snapshot_id,
        "raw_json": json.loads(selectors.snapshot_content(snapshot_id=args.snapshot_id)),
    }


def _restore_snapshot(args: RestoreSnapshotArgs) -> dict[str, int]:
    if args.raw_json is not None:
        return services.snapshot_restore(envelope=args.raw_json)
    return services.snapshot_restore_stored(snapshot_id=str(args.snapshot_id))


def _delete_snapshot(args: SnapshotArgs) -> dict[str, Any]:
    services.snapshot_delete(snapshot_id=args.snapshot_id)
    return {"deleted": args.snapshot_id}


async def create_snapshot(principal: Principal, args: CreateSnapshotArgs) -> dict[str, Any]:
    return await db_call(_create_snapshot)(args)


async def list_snapshots(principal: Principal, args: NoArgs) -> dict[str, Any]:
    return await db_call(_list_snapshots)()


async def get_snapshot(principal: Principal, args: SnapshotArgs) -> dict[str, Any]:
    return await db_call(_get_snapshot)(args)


async def export_snapshot(principal: Principal, args: SnapshotArgs) -> dict[str, Any]:
    return await db_call(_export_snapshot)(args)


async def restore_snapshot(principal: Principal, args: RestoreSnapshotArgs) -> dict[str, Any]:
    return dict(await db_call(_restore_snapshot)(args))


async def delete_snapshot(principal: Principal, args: SnapshotArgs) -> dict[str, Any]:
    return await db_call(_delete_snapshot)(args)


# --- hooks -----------------------------------------------------------------------------


class RegisterHookArgs(Args):
    """POST /v1/hooks's body; hooks.hook_spec checks every field (400 invalid_registration)."""

    owner: Any = Field(default=None, description="the registering app; (owner, name) is the identity")
    name: Any = None
    phase: Any = Field(default=None, description="pre | post")
    agents: Any = Field(default=None, description="agent name globs (exact or prefix*); default all")
    tools: Any = Field(default=None, description="tool name globs; default all")
    callback_url: Any = Field(default=None, description="http(s) URL the runtime POSTs the hook call to")
    fail_mode: Any = Field(default=None, description="open (default) | closed")
    timeout_ms: Any = Field(default=None, description="per call; default 5000, at most 60000")


class HookIdArgs(Args):
    id: str = Field(min_length=1, max_length=128, description="the hook's id (register_hook's answer)")


def _register_hook(principal: Principal, args: RegisterHookArgs) -> dict[str, Any]:
    row = hooks.hook_register(principal=principal, spec=hooks.hook_spec(args.model_dump(exclude_unset=True)))
    return {"id": row.hook_id}


def _list_hooks(principal: Principal) -> dict[str, Any]:
    rows = hook_selectors.hook_list(tenant=principal.read_tenant)
    return {"hooks": [hook_presenters.hook_out(row) for row in rows]}


def _delete_hook(principal: Principal, args: HookIdArgs) -> dict[str, Any]:
    return {"deleted": hooks.hook_delete(principal=principal, hook_id=args.id)}


async def register_hook(principal: Principal, args: RegisterHookArgs) -> dict[str, Any]:
    return await db_call(_register_hook)(principal, args)


async def list_hooks(principal: Principal, args: NoArgs) -> dict[str, Any]:
    return await db_call(_list_hooks)(principal)


async def delete_hook(principal: Principal, args: HookIdArgs) -> dict[str, Any]:
    return await db_call(_delete_hook)(principal, args)


async def pause_runtime(principal: Principal, args: PauseArgs) -> dict[str, Any]:
    return await pause(principal, args)


register(
    def_tool("schedule", "scheduledef"),
    def_tool("webhook", "webhookdef"),
    def_tool("a2aservercard", "a2aservercarddef"),
    def_tool("a2aagent", "a2aagentdef"),
    McpTool(
        "operatortokendef",
        "OperatorTokenDef op-dispatch (create, rotate, retire, get, list).",
        ADMIN,
        TokenOpArgs,
        operatortokendef,
    ),
    McpTool(
        "create_snapshot",
        "Capture the runtime into a stored snapshot (its parked runs when paused).",
        ADMIN,
        CreateSnapshotArgs,
        create_snapshot,
    ),
    McpTool(
        "list_snapshots", "Stored snapshots, newest first (metadata only, at most 200).", ADMIN, NoArgs, list_snapshots
    ),
    McpTool("get_snapshot", "A snapshot's metadata and its envelope.", ADMIN, SnapshotArgs, get_snapshot),
    McpTool(
        "export_snapshot",
        "A snapshot's envelope as raw_json (restore_snapshot takes it back).",
        ADMIN,
        SnapshotArgs,
        export_snapshot,
    ),
    McpTool(
        "restore_snapshot",
        "Restore (insert-or-ignore) a stored snapshot, or the envelope in raw_json.",
        ADMIN,
        RestoreSnapshotArgs,
        restore_snapshot,
    ),
    McpTool(
        "delete_snapshot",
        "Delete a stored snapshot; not_found when there is none.",
        ADMIN,
        SnapshotArgs,
        delete_snapshot,
    ),
    McpTool(
        "register_hook",
        "Register (or replace by owner+name) a pre- or post-tool webhook hook; returns {id}.",
        TENANT,
        RegisterHookArgs,
        register_hook,
    ),
    McpTool("list_hooks", "Your tenant's hooks in chain order.", TENANT, NoArgs, list_hooks),
    McpTool(
        "delete_hook", "Delete a hook by id; not_found when your tenant has none such.", TENANT, HookIdArgs, delete_hook
    ),
    McpTool("pause_runtime", "loomcycle's name of `pause`.", ADMIN, PauseArgs, pause_runtime),
    McpTool("resume_runtime", "loomcycle's name of `resume`.", ADMIN, NoArgs, resume),
    McpTool("get_runtime_state", "loomcycle's name of `state`.", ADMIN, NoArgs, state),
)
