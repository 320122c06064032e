"""Host tools (`loomcycle_project.extend.tool`) through the real engine, run in this process:
the schema comes from the signature, the run's context from the engine (never the model),
bad input is an is_error result, and the tool policy, tool-use hooks and redaction of the
built-ins apply to them unchanged."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Annotated, Any, Optional

import pytest
from pydantic import Field

from apps.core import toolregistry as registry
from apps.core.types import Principal
from apps.runs.models import Run, RunEvent
from apps.triggers.hooks import cache
from apps.triggers.hooks import services as hook_services
from apps.triggers.models import HookRegistration
from loomcycle_project.extend import RunContext, ToolError, run_create, tool
from tests.factories.extend import drive
from tests.triggers.hookserver import HookServer, hook_server, reply

pytestmark = pytest.mark.usefixtures("agents", "no_workers")

SECRET = "ghp_hosttoolsecret0123456789"
SEEN: list[RunContext] = []


@tool
def ext_lookup(
    run: RunContext,
    key: Annotated[str, Field(description="what to look up")],
    limit: Annotated[int, Field(ge=1, le=5)] = 2,
) -> dict[str, Any]:
    """Look a key up for the run's user."""
    SEEN.append(run)
    if key == "missing":
        raise ToolError(f"no entry {key!r}")
    return {"key": key, "limit": limit, "user": run.user_id, "tenant": run.tenant_id}


@tool(name="ext_leak", description="Returns a credential (redaction must catch it).")
def leak(token: str) -> str:
    return f"the token is {token}"


def scripted(calls: list[dict[str, Any]], **kw: Any) -> Run:
    script = [{"tools": calls}, {"text": "done"}]
    return run_create(agent="host-tools", prompt=f"MOCK_SCRIPT: {json.dumps(script)}", **kw)


def results(run_id: str) -> list[dict[str, Any]]:
    rows = RunEvent.objects.filter(run_id=run_id, type="tool_result").order_by("seq")
    return [{"name": e.payload["tool_use"]["name"], **e.payload} for e in rows]


def test_the_schema_and_description_come_from_the_signature_and_docstring() -> None:
    spec = registry.get("ext_lookup")
    assert spec is not None and spec.description == "Look a key up for the run's user."
    schema = spec.input_schema
    assert schema["required"] == ["key"] and set(schema["properties"]) == {"key", "limit"}  # no `run`
    limit = {"default": 2, "maximum": 5, "minimum": 1, "title": "Limit", "type": "integer"}
    assert schema["properties"]["limit"] == limit
    assert schema["additionalProperties"] is False
    assert ext_lookup(run=RunContext("r", "t", "u", "a", 0, "c"), key="k") == {  # still a plain function
        "key": "k",
        "limit": 2,
        "user": "u",
        "tenant": "t",
    }


def test_what_cannot_be_a_tool_is_refused_at_import() -> None:
    async def coro(x: int) -> int:
        """Async."""
        return x

    def untyped(x) -> int:  # type: ignore[no-untyped-def]
        """Untyped."""
        return 1

    def undocumented(x: int) -> int:
        return x

    for fn, message in ((coro, "async"), (untyped, "type annotation"), (undocumented, "description")):
        with pytest.raises(TypeError, match=message):
            tool(fn)
    with pytest.raises(ValueError, match="registered twice"):
        tool(name="ext_lookup")(_doc_fn)


def test_a_run_context_in_anything_but_the_bare_annotation_is_refused() -> None:
    """Wrapped, it would become an input field the model fills in (its own tenant_id)."""

    def optional(q: str, ctx: Optional[RunContext] = None) -> str:  # noqa: UP045 (the spelling under test)
        """Optional."""
        return q

    def union(q: str, ctx: RunContext | None = None) -> str:
        """Union."""
        return q

    def annotated(q: str, ctx: Annotated[RunContext, "the run"]) -> str:
        """Annotated."""
        return q

    def listed(q: str, ctxs: list[RunContext]) -> str:
        """A container."""
        return q

    for fn in (optional, union, annotated, listed):
        with pytest.raises(TypeError, match="exactly `RunContext`"):
            tool(fn)
    assert not any(registry.get(n) for n in ("optional", "union", "annotated", "listed"))


def _doc_fn(x: int) -> int:
    """A second tool under a taken name."""
    return x


def test_a_call_gets_the_runs_context_and_bad_input_is_an_error_the_model_reads() -> None:
    SEEN.clear()
    run = scripted(
        [
            {"tool": "ext_lookup", "input": {"key": "a", "limit": 3}},
            {"tool": "ext_lookup", "input": {"key": "b", "limit": 9}},  # over the bound
            {"tool": "ext_lookup", "input": {"key": "c", "run": {"user_id": "mallory"}}},  # no such field
            {"tool": "ext_lookup", "input": {"key": "missing"}},  # ToolError
        ],
        tenant_id="acme",
        user_id="u-alice",
    )
    assert drive(run).status == "completed"
    by_key = {r["tool_use"]["input"]["key"]: r for r in results(run.id)}
    assert not by_key["a"]["is_error"]
    assert json.loads(by_key["a"]["text"]) == {"key": "a", "limit": 3, "user": "u-alice", "tenant": "acme"}
    assert by_key["b"]["is_error"] and "limit: Input should be less than or equal to 5" in by_key["b"]["text"]
    assert by_key["c"]["is_error"] and "run: Extra inputs are not permitted" in by_key["c"]["text"]
    assert (by_key["missing"]["text"], by_key["missing"]["is_error"]) == ("no entry 'missing'", True)
    assert len(SEEN) == 2  # the two valid calls reached the function, the two invalid ones did not
    ctx = SEEN[0]
    assert (ctx.run_id, ctx.tenant_id, ctx.user_id, ctx.agent_name) == (run.id, "acme", "u-alice", "host-tools")
    assert ctx.idempotency_key == f"{run.id}:0:{ctx.call_id}" and ctx.call_id


def test_the_tool_policy_applies_agent_globs_and_caller_narrowing() -> None:
    assert {"ext_lookup", "ext_leak"} <= set(run_create(agent="host-tools", prompt="x").tools)
    narrowed = scripted([{"tool": "ext_lookup", "input": {"key": "a"}}], tools=["Context"])
    assert "ext_lookup" not in narrowed.tools
    assert "ext_lookup" not in run_create(agent="scripted", prompt="x").tools  # its globs do not match
    drive(narrowed)
    (result,) = results(narrowed.id)
    assert result["is_error"] and result["text"] == "tool 'ext_lookup' is not allowed for this run"


def test_what_a_host_tool_returns_is_stored_redacted() -> None:
    run = scripted([{"tool": "ext_leak", "input": {"token": SECRET}}], credentials={"github": SECRET})
    drive(run)
    (result,) = results(run.id)
    assert SECRET not in json.dumps(result)
    assert result["text"] == "the token is [redacted:github]"


@pytest.fixture
def hooks(settings: Any) -> Iterator[HookServer]:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_private_host_allowlist=("127.0.0.1",))
    with hook_server() as server:
        yield server
    HookRegistration.objects.all().delete()
    cache.bump()


def test_a_tool_use_hook_denies_a_host_tool_call(hooks: HookServer) -> None:
    url = hooks.on("/deny", reply({"deny": {"text": "lookups are off today"}}))
    principal = Principal(tenant_id="acme", subject="sec", scopes=frozenset({"substrate:tenant"}))
    spec = {"owner": "sec", "name": "no-lookups", "phase": "pre", "tools": ["ext_*"], "callback_url": url}
    hook_services.hook_register(principal=principal, spec=hook_services.hook_spec(spec))
    SEEN.clear()
    run = scripted([{"tool": "ext_lookup", "input": {"key": "a"}}], tenant_id="acme", user_id="u1")
    drive(run)
    (result,) = results(run.id)
    assert (result["text"], result["is_error"]) == ("lookups are off today", True)
    assert SEEN == []  # the function never ran
    (payload,) = hooks.calls("/deny")
    assert payload["tool_call"]["name"] == "ext_lookup" and payload["tool_call"]["input"] == {"key": "a"}
