"""The pre and post chains around one tool call (SPEC 9.3), as the engine's interceptor.

- Only hooks that apply run: the run's tenant (or a global hook), its agent
  (exact or `*`) and the tool (exact, `*` or a trailing-`*` prefix).
- Pre hooks run in registration order before the tool. Each may rewrite the
  input the next hook and the tool see (`{input}`), deny the call (`{deny}`:
  the tool never runs, the chain stops, earlier `allow_hosts` are dropped,
  the model reads a synthetic result), or widen the call's hosts
  (`{allow_hosts}`; honoured only for operator-permitted owners).
- Post hooks run in reverse registration order after the tool and may
  rewrite its result (`{result}`). A result that is not final yet (a
  sub-agent spawn, a parked call) is not passed through them.
- The pre and post chains of one call together spend at most
  LOOMCYCLE_HOOKS_CHAIN_BUDGET_MS in callbacks: a callback is cut off when the
  budget runs out, and a hook reached after that is not called; both count
  as failed callbacks.
- A callback that fails (network, timeout, non-2xx, malformed reply) is
  passed over when its `fail_mode` is open and fails the call (`is_error`)
  when it is closed. Nothing here fails or cancels a run.
- Each decision becomes a run event (`hook_deny`, `hook_rewrite`,
  `hook_error`, `host_widened`) carried on the ToolResult, so the user sees why a call
  changed. Payloads carry the call, never the prompt or the history.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings

from apps.core.toolregistry import ToolRunner
from apps.core.tools import ToolContext, ToolResult
from apps.triggers.hooks import cache, callback, widening
from apps.triggers.hooks.callback import HookCallFailed
from apps.triggers.hooks.types import Hook
from apps.triggers.models import HookFailMode, HookPhase

log = logging.getLogger("loomcycle.hooks")


@dataclass
class _Call:
    """One tool call as the chains see it, and what they decided so far."""

    ctx: ToolContext
    tool: str
    input: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    hosts: list[tuple[Hook, tuple[str, ...]]] = field(default_factory=list)  # permitted widenings
    budget_s: float = field(default_factory=lambda: settings.LOOMCYCLE.hooks_chain_budget_ms / 1000)  # callbacks only

    def callback(self, hook: Hook, payload: dict[str, Any]) -> dict[str, Any]:
        """One callback within what is left of the chain budget (the tool's own time is not counted)."""
        started = time.monotonic()
        try:
            return callback.call(hook, payload, started + self.budget_s)
        finally:
            self.budget_s -= time.monotonic() - started

    def payload(self, hook: Hook, phase: HookPhase) -> dict[str, Any]:
        ctx = self.ctx
        return {
            "phase": phase.value,
            "owner": hook.owner,
            "hook_name": hook.name,
            "agent": ctx.agent_name,
            "user_id": ctx.user_id,
            "agent_id": ctx.agent_id,
            "run_id": ctx.run_id,
            "tool_call": {"id": ctx.call_id, "name": self.tool, "input": self.input},
        }

    def event(self, kind: str, hook: Hook, **extra: Any) -> None:
        about = {
            "hook_id": hook.hook_id,
            "owner": hook.owner,
            "name": hook.name,
            "phase": hook.phase.value,
            "tool_call_id": self.ctx.call_id,
            "tool_name": self.tool,
        }
        self.events.append({"type": kind, "hook": {**about, **extra}})


def intercept(ctx: ToolContext, tool: str, data: dict[str, Any], runner: ToolRunner) -> ToolResult:
    """The engine's interceptor (apps.core.toolregistry): the chains around `runner`."""
    hooks = [h for h in cache.hooks() if h.applies(tenant_id=ctx.tenant_id, agent=ctx.agent_name, tool=tool)]
    if not hooks:
        return runner(ctx, data)
    call = _Call(ctx=ctx, tool=tool, input=data)
    denied = _pre_chain(call, [h for h in hooks if h.phase == HookPhase.PRE])
    if denied is not None:
        return replace(denied, events=tuple(call.events))
    tool_ctx = widening.apply(call.ctx, call.tool, call.hosts, call.input, call.events)
    before, call.events = call.events, []
    result = runner(tool_ctx, call.input)
    if result.spawn is None and result.park is None:
        result = _post_chain(call, result, [h for h in reversed(hooks) if h.phase == HookPhase.POST])
    return replace(result, events=(*before, *result.events, *call.events))


def _pre_chain(call: _Call, hooks: list[Hook]) -> ToolResult | None:
    """Run the pre hooks; the synthetic result when one denies the call (or fails closed)."""
    for hook in hooks:
        try:
            reply = call.callback(hook, call.payload(hook, HookPhase.PRE))
            denied = _apply_pre(call, hook, reply)
        except HookCallFailed as exc:
            denied = _failed(call, hook, exc)
        if denied is not None:
            return denied
    return None


def _apply_pre(call: _Call, hook: Hook, reply: dict[str, Any]) -> ToolResult | None:
    """Check the whole reply, then apply it (a malformed reply changes nothing)."""
    unknown = sorted(set(reply) - {"input", "deny", "allow_hosts"})
    if unknown:
        raise HookCallFailed(f"pre reply has unknown fields {unknown}; it may carry input, deny, allow_hosts")
    if reply.get("deny") is not None:
        return _deny(call, hook, reply["deny"])
    new_input = reply.get("input")
    if new_input is not None and not isinstance(new_input, dict):
        raise HookCallFailed("pre reply: input must be a JSON object")
    hosts = widening.parse(reply["allow_hosts"]) if reply.get("allow_hosts") is not None else ()
    if new_input is not None:
        call.input = new_input
        call.event("hook_rewrite", hook, input=new_input)
    if hosts and widening.permitted(hook):
        call.hosts.append((hook, hosts))
    elif hosts:
        log.warning("hook %s (tenant %r) may not widen hosts: not permitted", hook.label, hook.tenant_id)
    return None


def _deny(call: _Call, hook: Hook, deny: Any) -> ToolResult:
    if not isinstance(deny, dict):
        raise HookCallFailed("pre reply: deny must be an object {is_error, text}")
    text, is_error = deny.get("text", f"denied by hook {hook.label}"), deny.get("is_error", True)
    if not isinstance(text, str) or not isinstance(is_error, bool):
        raise HookCallFailed("pre reply: deny.text must be a string and deny.is_error a boolean")
    call.hosts = []  # a denial discards what earlier hooks widened
    call.event("hook_deny", hook, text=text, is_error=is_error)
    return ToolResult(text, is_error=is_error)


def _post_chain(call: _Call, result: ToolResult, hooks: list[Hook]) -> ToolResult:
    for hook in hooks:
        payload = call.payload(hook, HookPhase.POST)
        payload["tool_result"] = {"is_error": result.is_error, "text": result.text}
        try:
            result = _apply_post(call, hook, result, call.callback(hook, payload))
        except HookCallFailed as exc:
            failed = _failed(call, hook, exc)
            if failed is not None:
                return replace(result, text=failed.text, is_error=True)
    return result


def _apply_post(call: _Call, hook: Hook, result: ToolResult, reply: dict[str, Any]) -> ToolResult:
    unknown = sorted(set(reply) - {"result"})
    if unknown:
        raise HookCallFailed(f"post reply has unknown fields {unknown}; it may carry result")
    new = reply.get("result")
    if new is None:
        return result
    if not isinstance(new, dict):
        raise HookCallFailed("post reply: result must be an object {is_error, text}")
    text, is_error = new.get("text", result.text), new.get("is_error", result.is_error)
    if not isinstance(text, str) or not isinstance(is_error, bool):
        raise HookCallFailed("post reply: result.text must be a string and result.is_error a boolean")
    call.event("hook_rewrite", hook, result={"is_error": is_error, "text": text})
    return replace(result, text=text, is_error=is_error)


def _failed(call: _Call, hook: Hook, exc: HookCallFailed) -> ToolResult | None:
    """Fail open (None: the chain goes on) or closed (the call's is_error result)."""
    closed = hook.fail_mode == HookFailMode.CLOSED
    log.warning("hook %s (%s) failed on %s, fail_mode %s: %s", hook.label, hook.hook_id, call.tool, hook.fail_mode, exc)
    call.event("hook_error", hook, fail_mode=hook.fail_mode.value, error=str(exc))
    if not closed:
        return None
    text = f"tool call failed: hook {hook.label} did not answer usably ({exc}) and fails closed"
    return ToolResult(text, is_error=True)
