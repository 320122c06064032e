"""Host tools: a typed Python function of the deployment's own code, turned into an agent tool.

`@tool` reads the function's signature: every parameter but the one annotated
`RunContext` becomes a field of a pydantic model, whose JSON schema is the
tool's input schema; the docstring is its description. The tool is registered
with `apps.core.toolregistry` when it is decorated, so a user's app imports its
tools module from `AppConfig.ready()` (docs/extending.md), and from then on it
is a tool like the built-ins: the run's tool policy (operator floor, agent
`tools:` globs, caller narrowing), tool-use hooks (`registry.intercepted`) and
the redaction of what is stored apply to it unchanged, since all of them live
around `registry` and `apps.runs.engine.toolrun`, not in the tools. It runs with the
deployment's rights, so it is registered `operator_only`, as Bash is: only agents
of the operator's yaml and listed tenants may use it (apps.core.privileged).

Invariants:
- The model never sees or sets the run's context: `RunContext` comes from the
  engine's `ToolContext`, never from the input schema.
- Input is validated before the function runs; invalid input (or a `ToolError`
  the function raises) is an `is_error` result the model reads, never a crash.
  Any other exception becomes an `is_error` result in `apps.runs.engine.toolrun`.
- The function runs synchronously on the tool thread the engine gives it, with no
  transaction open and outside the engine's admission slot (the engine leaves
  it for the tool batch); this thread's connection is handed back to the pool
  when it returns, as `apps.core.tools.db_tool_result` does for built-ins.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar, overload

import pydantic_core
from django.db import close_old_connections, connection
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from apps.core import toolregistry as registry
from apps.core.tools import Tool, ToolContext, ToolResult

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class RunContext:
    """Who a host tool acts for: the calling run, its tenant and user. Filter every
    query by `tenant_id` (and `user_id` where rows belong to users): a host tool
    serves every tenant's runs that its policy admits."""

    run_id: str
    tenant_id: str
    user_id: str
    agent_name: str
    step: int
    call_id: str

    @property
    def idempotency_key(self) -> str:
        """`run_id:step:call_id`: a redelivered iteration repeats it (dedupe side effects on it)."""
        return f"{self.run_id}:{self.step}:{self.call_id}"


class ToolError(Exception):
    """Raise it from a host tool to answer the model with an `is_error` result (its message)."""


@dataclass(frozen=True)
class HostTool(Generic[P, R]):
    """What `@tool` made: the registered tool, and the function, still callable (and typed) as it was."""

    tool: Tool
    fn: Callable[P, R]
    model: type[BaseModel]
    context_param: str | None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)


@overload
def tool(fn: Callable[P, R], /) -> HostTool[P, R]: ...


@overload
def tool(*, name: str | None = None, description: str | None = None) -> Callable[[Callable[P, R]], HostTool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None, /, *, name: str | None = None, description: str | None = None
) -> HostTool[P, R] | Callable[[Callable[P, R]], HostTool[P, R]]:
    """Decorate a typed, synchronous function to register it as an agent tool (`@tool` or
    `@tool(name=..., description=...)`). The name defaults to the function's name, the
    description to its docstring (required: the model reads it). Raises TypeError at
    import for what cannot be a tool (async, untyped or positional-only parameters, no
    description, a bad name); ValueError if the name is taken."""

    def wrap(func: Callable[P, R]) -> HostTool[P, R]:
        host = build(func, name=name or str(getattr(func, "__name__", "")), description=description)
        registry.register(host.tool)
        return host

    return wrap(fn) if fn is not None else wrap


def build(func: Callable[P, R], *, name: str, description: str | None) -> HostTool[P, R]:
    """The HostTool for `func`, not registered (`tool` registers it)."""
    if inspect.iscoroutinefunction(func):
        raise TypeError(f"host tool {name!r}: async functions are not supported; write a sync function")
    if not NAME.match(name):
        raise TypeError(f"host tool name {name!r} must match {NAME.pattern}")
    text = (description or inspect.getdoc(func) or "").strip()
    if not text:
        raise TypeError(f"host tool {name!r} needs a description: give the function a docstring")
    model, context_param = _input_model(func, name)
    call = _Call(name=name, fn=func, model=model, context_param=context_param)
    host_tool = Tool(name=name, description=text, input_schema=_schema(model), execute=call.execute, operator_only=True)
    return HostTool(tool=host_tool, fn=func, model=model, context_param=context_param)


def _input_model(func: Callable[..., Any], name: str) -> tuple[type[BaseModel], str | None]:
    """The pydantic model of the function's parameters, and the name of its RunContext parameter."""
    hints = typing.get_type_hints(func, include_extras=True)
    fields: dict[str, Any] = {}
    context_param = None
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.POSITIONAL_ONLY, param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"host tool {name!r}: parameter {param.name!r} must be a plain or keyword parameter")
        if param.name not in hints:
            raise TypeError(f"host tool {name!r}: parameter {param.name!r} needs a type annotation")
        if hints[param.name] is RunContext:
            context_param = param.name
            continue
        if _mentions_context(hints[param.name]):  # else a model-written field: a forged tenant_id
            raise TypeError(
                f"host tool {name!r}: parameter {param.name!r} must be annotated exactly `RunContext` "
                "(not Optional, a union, Annotated or a container of it)"
            )
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (hints[param.name], default)
    model = create_model(f"{name}_input", __config__=ConfigDict(extra="forbid"), **fields)
    return model, context_param


def _mentions_context(hint: Any) -> bool:
    """Whether RunContext (or a subclass) appears anywhere in `hint`: unions, Optional, Annotated, generics."""
    if isinstance(hint, type) and issubclass(hint, RunContext):
        return True
    return any(_mentions_context(arg) for arg in typing.get_args(hint))


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    schema.setdefault("properties", {})
    return schema


@dataclass(frozen=True)
class _Call:
    """One host tool's `Tool.execute`: validate, add the run's context, call, serialise."""

    name: str
    fn: Callable[..., Any]
    model: type[BaseModel]
    context_param: str | None

    def execute(self, ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
        try:
            parsed = self.model.model_validate(data)
        except ValidationError as exc:
            return ToolResult(f"invalid input for {self.name}: {_errors(exc)}", is_error=True)
        kwargs = {field: getattr(parsed, field) for field in type(parsed).model_fields}
        if self.context_param:
            kwargs[self.context_param] = _context(ctx)
        close_old_connections()
        try:
            out = self.fn(**kwargs)
        except ToolError as exc:
            return ToolResult(str(exc), is_error=True)
        finally:
            connection.close()  # hand this thread's connection back before the step commits
        return ToolResult(out if isinstance(out, str) else pydantic_core.to_json(out).decode())


def _errors(exc: ValidationError) -> str:
    """`field: message` per error, what the model needs to correct its call."""
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "input"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _context(ctx: ToolContext) -> RunContext:
    return RunContext(
        run_id=ctx.run_id,
        tenant_id=ctx.tenant_id,
        user_id=ctx.user_id,
        agent_name=ctx.agent_name,
        step=ctx.step,
        call_id=ctx.call_id,
    )
