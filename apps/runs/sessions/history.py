"""`History`: an agent browses past conversations (SPEC 6, loomcycle's History tool): op=list (latest
activity first, paged by cursor), search (a title match), get (one conversation's user and assistant
turns).

Who may see what is the agent's `history_scope` (default-deny: none listed, no op works) and the
op's `scope`: `self` (the conversations with a run of this agent, default), `user` (this run's
end user's), `tenant` (the tenant's). The owner always comes from the run, never from the input:
a model cannot name another user or tenant. `global` (every tenant) is the operator's and is
refused here. A conversation outside the scope answers as a missing one.
"""

from __future__ import annotations

from typing import Any

from apps.core.tools import Tool, ToolContext, ToolRefusal, ToolResult, db_tool_result
from apps.runs.sessions.listing import SessionFilter, session_has_agent, sessions_page
from apps.runs.sessions.selectors import session_head, session_history
from apps.substrate.models import AgentDef

_OPS = ("list", "search", "get")
_SCOPES = ("self", "user", "tenant", "global")
MAX_TURN_CHARS = 4000


def history_scopes(agent_def_id: str) -> list[str]:
    """The agent's `history_scope` (its pinned definition's), [] when it has none."""
    definition = AgentDef.objects.filter(id=agent_def_id).values_list("definition", flat=True).first() or {}
    scopes = definition.get("history_scope") if isinstance(definition, dict) else None
    return [s for s in scopes if isinstance(s, str)] if isinstance(scopes, list) else []


def _scope(ctx: ToolContext, data: dict[str, Any]) -> str:
    scope = data.get("scope") or "self"
    if scope not in _SCOPES:
        raise ToolRefusal(f"history: unknown scope {scope!r} (want one of: {', '.join(_SCOPES)})")
    allowed = history_scopes(ctx.agent_def_id)
    if scope == "global":
        raise ToolRefusal("history: scope global (every tenant) is the operator's, not an agent's")
    if scope not in allowed:
        if not allowed:
            raise ToolRefusal(f"history: no history_scope on this agent (default-deny); grant [{scope}] to allow it")
        raise ToolRefusal(f"history: scope {scope!r} not permitted (allowed: {', '.join(allowed)})")
    if scope == "user" and not ctx.user_id:
        raise ToolRefusal("history: scope user needs a run with a user_id")
    return scope


def _filter(ctx: ToolContext, scope: str) -> SessionFilter:
    if scope == "self":
        return SessionFilter(agent=ctx.agent_name)
    if scope == "user":
        return SessionFilter(user_id=ctx.user_id)
    return SessionFilter()


def _list(ctx: ToolContext, data: dict[str, Any], scope: str, *, query: str = "") -> dict[str, Any]:
    limit = data.get("limit", 20)
    if not isinstance(limit, int) or not 1 <= limit <= 100:
        raise ToolRefusal("history: limit must be an integer between 1 and 100")
    cursor = data.get("cursor") or ""
    page = sessions_page(tenant_id=ctx.tenant_id, f=_filter(ctx, scope), limit=limit, cursor=str(cursor))
    rows = [s for s in page.sessions if query.lower() in s["title"].lower()] if query else page.sessions
    return {"scope": scope, "chats": rows, "next_cursor": page.next_cursor}


def _get(ctx: ToolContext, data: dict[str, Any], scope: str) -> dict[str, Any]:
    session_id = data.get("session_id")
    if not isinstance(session_id, str) or not session_id:
        raise ToolRefusal("history: get needs a session_id")
    owner = ctx.user_id if scope == "user" else None
    head = session_head(tenant_id=ctx.tenant_id, session_id=session_id, owner=owner)  # NotFound outside it
    if scope == "self" and not session_has_agent(tenant_id=ctx.tenant_id, session_id=head.id, agent=ctx.agent_name):
        raise ToolRefusal(f"session_not_found: unknown session {session_id}")  # as session_head's answer
    turns = []
    for role, content in session_history(tenant_id=ctx.tenant_id, session_id=session_id):
        text = "".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
        if text:
            turns.append({"role": role, "text": text[:MAX_TURN_CHARS]})
    return {"session_id": head.id, "agent": head.agent, "user_id": head.user_id, "turns": turns}


def _run(ctx: ToolContext, data: dict[str, Any]) -> dict[str, Any]:
    op = data.get("op")
    scope = _scope(ctx, data)
    if op == "list":
        return _list(ctx, data, scope)
    if op == "search":
        query = data.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ToolRefusal("history: search needs a query")
        return _list(ctx, data, scope, query=query.strip())
    if op == "get":
        return _get(ctx, data, scope)
    raise ToolRefusal(f"history: unknown op {op!r} (want one of: {', '.join(_OPS)})")


def history_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    """A refusal or a missing (or out-of-scope: the same answer) session is an is_error result."""
    return db_tool_result(lambda: _run(ctx, data))


HISTORY_TOOL = Tool(
    name="History",
    description="Browse PAST conversations (a chat = a session): op=list (latest activity first; limit, cursor), "
    "search (a title match: query), get (one chat's user/assistant turns: session_id). scope picks whose chats: "
    "self (this agent's, default), user (this end user's), tenant (this tenant's); the agent's history_scope "
    "lists the scopes it may use. Owners come from the run, never from the input.",
    input_schema={
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": list(_OPS)},
            "scope": {"type": "string", "enum": list(_SCOPES)},
            "session_id": {"type": "string", "description": "get: the chat's session id."},
            "query": {"type": "string", "description": "search: case-insensitive title match."},
            "limit": {"type": "integer", "description": "list/search: chats per page, 1..100 (default 20)."},
            "cursor": {"type": "string", "description": "list/search: the previous page's next_cursor."},
        },
        "required": ["op"],
        "additionalProperties": False,
    },
    execute=history_execute,
)
