"""The OpenAPI description of /v1, completed where ninja leaves gaps.

Routes that parse their body themselves (`apps.core.http.parse_body`) declare
it with `openapi_body`, whose JSON schema carries pydantic's local `$defs`;
ninja copies it into the operation as is, so `#/$defs/X` would point at the
document root, where nothing is. `complete_schema` moves those definitions to
`components/schemas` (refs are generated against it) and adds what every
route shares: the bearer scheme, the one error body of
`ApplicationError.body()`, and a response schema for a route that declares
none. Invariant: after it, every `$ref` resolves inside the document.
"""

from __future__ import annotations

import copy
from typing import Any

from ninja import NinjaAPI
from ninja.openapi.schema import OpenAPISchema
from ninja.operation import Operation

from apps.core.ids import IDENT_RE
from apps.memory.models import MemoryScope
from apps.runs.statuses import InterruptStatus

COMPONENTS = "#/components/schemas/"
EVENT_STREAM = "text/event-stream"

ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "description": "Every 4xx/5xx body of /v1: a machine-readable code, a human message, and details.",
    "properties": {
        "code": {"type": "string", "description": "machine-readable, e.g. invalid_request, not_found"},
        "error": {"type": "string", "description": "a message for humans"},
        "details": {"type": "object", "additionalProperties": True},
    },
    "required": ["code", "error"],
}

ERROR_RESPONSES: dict[str, str] = {
    "400": "Invalid request (code invalid_request, invalid_value, ...)",
    "401": "Missing or unknown bearer token (code unauthorized)",
    "403": "The credential may not do this (code forbidden)",
    "404": "No such object for this tenant (code not_found)",
    "409": "Conflicts with the object's state (code conflict)",
    "422": "Well-formed but not acceptable in this state (its own code, e.g. step_out_of_range)",
    "429": "Quota or rate limit exhausted (a Retry-After header may say when)",
    "500": "A bug on the server, logged there (code internal_error)",
    "503": "The runtime is paused or a dependency is unavailable",
}

# Besides ERROR_RESPONSES: an operation with a request body may also answer these.
BODY_ERROR_RESPONSES: dict[str, str] = {
    "413": "The body is over a size limit (code payload_too_large, snapshot_too_large, ...)",
    "415": "The body's Content-Type is not one this route reads (code unsupported_media_type)",
}

# Operations that can answer 410 (the object existed and has expired), by operationId.
GONE_OPERATIONS: dict[str, str] = {
    "interrupts_resolve": "The interrupt expired before this answer (code interrupt_expired)",
}

# Operations that answer with Server-Sent Events, by operationId: the runs
# stream always, the others unless their body asks for JSON (background:true,
# stream:false), so both media types are documented for them.
SSE_OPERATIONS: dict[str, str] = {
    "runs_stream": "The run's events as SSE (id: seq, event: kind, data: JSON)",
    "runs_create": "The run's events as SSE, unless background:true (then 202 JSON)",
    "sessions_messages": "The new run's events as SSE, unless background:true (then 202 JSON)",
    "chat_completions": "chat.completion.chunk frames as SSE when stream:true",
    "llm_chat": "named SSE events when stream:true",
    "users_agents_stream": "SSE: `stream_open`, then `run_state` frames (data: RunStateOut)",
}

# Of those, the ones whose 200 is never JSON (POST /v1/runs answers JSON with 202).
SSE_ONLY = frozenset({"runs_stream", "runs_create", "sessions_messages", "users_agents_stream"})

# The event schema of each SSE operation: one frame is `id:` (optional), `event:`, `data:` (one
# JSON line). OpenAPI 3.1 has no schema for a stream's items (3.2's `itemSchema`), so the media
# type carries it as `x-sse-event` (a $ref), and its `schema` describes the frames in prose.
SSE_EVENT_SCHEMAS: dict[str, Any] = {
    "RunStreamEvent": {
        "title": "RunStreamEvent",
        "type": "object",
        "description": "One frame of a run's stream (apps.runs.streams.sse_encode); `: keepalive` comments between.",
        "properties": {
            "id": {"type": "integer", "description": "the event's seq: send it back as Last-Event-ID to resume"},
            "event": {"type": "string", "description": "the event type (text, tool_call, tool_result, done, ...)"},
            "data": {"type": "object", "additionalProperties": True, "description": "the event's payload"},
        },
        "required": ["event", "data"],
    },
    "ChatCompletionChunkEvent": {
        "title": "ChatCompletionChunkEvent",
        "type": "object",
        "description": "OpenAI's stream: unnamed frames whose data is a chat.completion.chunk, then `data: [DONE]`.",
        "properties": {"data": {"type": "object", "additionalProperties": True}},
        "required": ["data"],
    },
    "LlmChatEvent": {
        "title": "LlmChatEvent",
        "type": "object",
        "description": "Named frames of the native gateway stream (apps.gateway.native): event and its JSON data.",
        "properties": {"event": {"type": "string"}, "data": {"type": "object", "additionalProperties": True}},
        "required": ["event", "data"],
    },
    "UserRunStateEvent": {
        "title": "UserRunStateEvent",
        "type": "object",
        "description": "One frame of a user's run-state stream (apps.runs.userstream): `stream_open` once, then "
        "`run_state` frames whose data is a RunStateOut; `: keepalive` comments between.",
        "properties": {
            "event": {"type": "string", "enum": ["stream_open", "run_state"]},
            "data": {"type": "object", "additionalProperties": True},
        },
        "required": ["event", "data"],
    },
}
SSE_EVENTS: dict[str, str] = {
    "runs_stream": "RunStreamEvent",
    "runs_create": "RunStreamEvent",
    "sessions_messages": "RunStreamEvent",
    "chat_completions": "ChatCompletionChunkEvent",
    "llm_chat": "LlmChatEvent",
    "users_agents_stream": "UserRunStateEvent",
}


def sse_content(operation_id: str) -> dict[str, Any]:
    """The text/event-stream media type of an SSE operation, with its event schema."""
    event = SSE_EVENTS[operation_id]
    prose = f"Server-Sent Events; each frame is a {event} (components/schemas/{event})"
    return {"schema": {"type": "string", "description": prose}, "x-sse-event": {"$ref": COMPONENTS + event}}


# Path parameters that routes take as plain `str` and check in their service
# (apps.core.ids.is_ident, the memory scope, a schedule's def_id): the same
# rule, documented. The services' checks stay what decides.
IDENT = f"^{IDENT_RE.pattern}$"
PATH_PARAMS: dict[str, dict[str, Any]] = {
    "run_id": {"type": "string", "pattern": IDENT},
    "agent_id": {"type": "string", "pattern": IDENT},
    "user_id": {"type": "string", "pattern": IDENT},
    "interrupt_id": {"type": "string", "pattern": IDENT},
    "def_id": {"type": "string", "pattern": "^def_[A-Za-z0-9_-]{1,124}$"},
    "snapshot_id": {"type": "string", "pattern": IDENT},
    "session_id": {"type": "string", "pattern": IDENT},
    "scope": {"type": "string", "enum": list(MemoryScope.values)},
}

# An interrupt list's `?status=`: empty, `all`, or a comma-separated list of statuses.
_ONE_STATUS = "|".join(InterruptStatus.values)
INTERRUPT_STATUSES = f"^(all|(({_ONE_STATUS})(,({_ONE_STATUS}))*))?$"

# Query parameters with a range their route checks itself, by operationId.
QUERY_PARAMS: dict[tuple[str, str], dict[str, Any]] = {
    ("runs_events", "from_seq"): {"minimum": 0},
    ("runs_events", "limit"): {"minimum": 1, "maximum": 5000},
    **{
        (operation, "status"): {"pattern": INTERRUPT_STATUSES}
        for operation in (
            "interrupts_of_run",
            "interrupts_of_user",
        )
    },
}

ANY_JSON: dict[str, Any] = {"type": "object", "additionalProperties": True}


class LoomcycleAPI(NinjaAPI):
    """NinjaAPI whose OpenAPI schema is completed by `complete_schema`, and whose
    operation ids are the view functions' names (docs/api.md, "Operation ids")."""

    def get_openapi_operation_id(self, operation: Operation) -> str:
        # `runs_create`, not ninja's `apps_runs_api_runs_create`: generated clients name their
        # methods after it. An explicit `operation_id=` on the decorator still wins;
        # `complete_schema` refuses two operations with one id.
        return str(operation.view_func.__name__)

    def get_openapi_schema(
        self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None
    ) -> OpenAPISchema:
        # A deep copy: ninja's schema shares dicts with the routes' openapi_extra,
        # which completing it must not change (the next build would lose the $defs).
        schema = copy.deepcopy(super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params))
        complete_schema(schema)
        return schema


def complete_schema(schema: dict[str, Any]) -> None:
    """Complete `schema` in place (see the module docstring)."""
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Error"] = ERROR_SCHEMA
    schemas.update(SSE_EVENT_SCHEMAS)
    seen: dict[str, str] = {}
    for path, path_item in schema.get("paths", {}).items():
        for method, operation in path_item.items():
            _unique_id(operation, f"{method.upper()} {path}", seen)
            _hoist_body_defs(operation, schemas)
            _constrain_params(operation)
            _complete_responses(operation)


def _unique_id(operation: dict[str, Any], where: str, seen: dict[str, str]) -> None:
    """Operation ids are function names, so two routes' functions of one name would collide:
    a build error naming both (rename one function, or pass `operation_id=`)."""
    op_id = operation.get("operationId", "")
    if op_id in seen:
        raise ValueError(f"OpenAPI: operationId {op_id!r} of {where} is also {seen[op_id]}'s")
    seen[op_id] = where


def _hoist_body_defs(operation: dict[str, Any], schemas: dict[str, Any]) -> None:
    """Move the request body's `$defs` into components; a name defined twice
    with different schemas is a bug in our models, so it raises."""
    for media in operation.get("requestBody", {}).get("content", {}).values():
        defs = media.get("schema", {}).pop("$defs", {})
        for name, definition in defs.items():
            if name in schemas and schemas[name] != definition:
                raise ValueError(f"OpenAPI: two different schemas are named {name}")
            schemas[name] = definition


def _constrain_params(operation: dict[str, Any]) -> None:
    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "path":
            rule = PATH_PARAMS.get(parameter["name"], {})
        else:
            rule = QUERY_PARAMS.get((operation.get("operationId", ""), parameter["name"]), {})
        if rule:
            parameter["schema"] = {**parameter.get("schema", {}), **rule}


def _complete_responses(operation: dict[str, Any]) -> None:
    responses = {str(status): response for status, response in operation.get("responses", {}).items()}
    operation["responses"] = responses
    sse = SSE_OPERATIONS.get(operation.get("operationId", ""))
    if sse:
        responses.setdefault("200", {"description": sse})
    for status, response in responses.items():
        if not str(status).startswith("2"):
            continue
        if str(status) == "204":  # No Content: a body-less answer declares none (RFC 9110 15.3.5)
            response.pop("content", None)
            continue
        content = response.setdefault("content", {})
        if sse and str(status) == "200":
            response["description"] = sse
            content[EVENT_STREAM] = sse_content(operation.get("operationId", ""))
            if operation.get("operationId") in SSE_ONLY:
                content.pop("application/json", None)
                continue
        content.setdefault("application/json", {"schema": ANY_JSON})
    errors = dict(ERROR_RESPONSES)
    if "requestBody" in operation:
        errors.update(BODY_ERROR_RESPONSES)
    if operation.get("operationId") in GONE_OPERATIONS:
        errors["410"] = GONE_OPERATIONS[operation["operationId"]]
    for status, description in sorted(errors.items()):
        responses.setdefault(
            status,
            {"description": description, "content": {"application/json": {"schema": {"$ref": COMPONENTS + "Error"}}}},
        )
