"""Typed results of the client: TypedDicts of the API's JSON bodies (plain dicts at run time, so a
field the server adds later reaches the caller; type checkers see the documented ones). Their
fields are the OpenAPI components of /v1/openapi.json (apps.runs.schemas.RunOut, ...)."""

from typing import Any, NotRequired, TypedDict


class Run(TypedDict):
    """GET /v1/runs/{run_id}, /v1/agents/{agent_id}: one run."""

    agent_id: str
    run_id: str
    session_id: str
    agent: str
    user_id: str
    parent_agent_id: str | None
    parent_context: Any
    status: str  # running (any live state) | completed | failed | cancelled | ...
    state: str  # the exact state
    step: int
    started_at: str | None
    completed_at: str | None
    stop_reason: str
    error: str
    usage: dict[str, Any]
    last_heartbeat_at: str | None
    live: bool
    interactive: bool
    awaited_state: str
    awaited_on: str
    resident: bool
    resident_state: str
    agent_def_id: str | None
    content_sha256: str
    last_seq: int
    forked_from_run: str | None
    forked_at_step: int | None
    tenant_id: NotRequired[str]  # in GET /v1/runs


class Session(TypedDict):
    """GET /v1/sessions: one conversation (the OpenAPI `SessionOut`)."""

    session_id: str
    agent: str
    user_id: str
    title: str
    created_at: str
    last_activity_at: str
    run_count: int
    last_run_id: str
    status: str  # the latest run's (running for any live state)
    metadata: dict[str, Any]


class DefName(TypedDict):
    """GET /v1/_<kind>def/names: one definition name (the OpenAPI `DefNameOut`)."""

    name: str
    tenant_id: str
    version_count: int
    active_def_id: str  # "" when no version is active
    latest_version: int
    last_updated: str | None
    live_version_count: int
    active_retired: bool
    static: NotRequired[bool | None]  # the def kinds' (a yaml-declared version); operator tokens have none


class MemoryEntry(TypedDict):
    """One key of GET /v1/_memory/.../keys (the OpenAPI `MemoryEntryOut`)."""

    key: str
    value: Any
    expires_at: str | None
    created_at: str | None
    updated_at: str | None
    embedded: bool


class MemoryPut(TypedDict):
    """PUT of a memory key (the OpenAPI `MemoryPutOut`)."""

    scope: str
    scope_id: str
    key: str
    embedded: bool
    embed_warning: NotRequired[str | None]


class MemoryHit(TypedDict):
    """One hit of POST /v1/_memory/search (the OpenAPI `MemoryHitOut`)."""

    key: str
    value: Any
    expires_at: str | None
    score: float
    similarity: float
    embedded_with: dict[str, str]  # provider, model
    kind: str
    merged_keys: NotRequired[list[str] | None]


class MemorySearch(TypedDict):
    """POST /v1/_memory/search (the OpenAPI `MemorySearchOut`)."""

    scope: str
    scope_id: str
    entries: list[MemoryHit]
    query_embedding_dim: int
    truncated: bool


class Channel(TypedDict):
    """GET /v1/_channels: one channel (the OpenAPI `ChannelOut`)."""

    name: str
    description: str
    scope: str
    semantic: str
    publisher: str
    period: str
    default_ttl: int
    max_messages: int
    source: str
    message_count: int
    newest_visible_at: str | None
    created_at: str | None
    updated_at: str | None


class ChannelMessage(TypedDict):
    """One message of a peek or subscribe (the OpenAPI `ChannelMessageOut`)."""

    id: str
    value: Any
    published_at: str


class ChannelPublished(TypedDict):
    """A publish's answer (the OpenAPI `ChannelPublishedOut`)."""

    msg_id: str
    channel: str
    created_at: str
    dropped_oldest: int
    visible_at: NotRequired[str | None]  # when deliver_at deferred the message


class ChannelRead(TypedDict):
    """A subscribe's answer (the OpenAPI `ChannelReadOut`)."""

    channel: str
    messages: list[ChannelMessage]
    next_cursor: str


# Lists of them, named: the client's classes have a method called `list`, which an annotation
# written `list[...]` inside them would name instead of the builtin.
DefNames = list[DefName]
ChannelList = list[Channel]
Messages = list[ChannelMessage]
MemoryEntries = list[MemoryEntry]
