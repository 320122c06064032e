"""`WebSearch` (SPEC 6.10): a query -> ranked (title, URL, snippet) hits, as loomcycle's
tool (input `query`, `max_results` 1..100 clamped to 25, default 5; plus `recency`, see
docs/compat.md), over the operator's search backends (apps.tools.search_backends).

Invariants:
- Registered always, refusing every call until the operator declares a backend
  (SPEC 6.1 layer 1: the model reads "not configured", not "unknown tool").
- The backends are tried in the agent's `search_providers` order (those configured),
  else `search_priority`; one that fails, has no key, or has no hit left after the
  host filter is passed over for the next. Only the last failure's reason is shown.
- The run's host narrowing: when the caller narrowed `allowed_hosts`, the hits
  outside them are dropped unless the request said `web_search_filter: keep`
  (`ToolContext.web_search_filter`: "" = not narrowed).
- Each hit reaches the model as a `search_result` untrusted block (`<` escaped), as an
  untrusted prompt segment of that kind is rendered: page text is data, not instructions.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

from apps.core.config import runtime_config
from apps.core.errors import ApplicationError
from apps.core.hosts import host_matches
from apps.core.tools import Tool, ToolContext, ToolRefusal, ToolResult
from apps.runs.prompt import render_untrusted
from apps.substrate.selectors import agent_definition
from apps.tools.search_backends import RECENCY, Hit, Query, SearchConfig, SearchFailed, search, search_config

DEFAULT_RESULTS = 5
MAX_RESULTS = 25  # loomcycle's hard cap, whatever the schema allows
MAX_SNIPPET_CHARS = 256
NOT_CONFIGURED = (
    "WebSearch is not configured: the operator declares search backends in loomcycle.yaml "
    "(search_providers: {searxng: {base_url: ...}} or brave with BRAVE_API_KEY)"
)
_TAG = re.compile(r"<[^>]{0,200}>")


def _query(data: dict[str, Any]) -> Query:
    unknown = sorted(set(data) - {"query", "max_results", "recency"})
    if unknown:
        raise ToolRefusal(f"unknown fields {unknown}; WebSearch takes query, max_results, recency")
    text = data.get("query")
    if not isinstance(text, str) or not text.strip():
        raise ToolRefusal("query is required (the words to search for)")
    count = data.get("max_results", DEFAULT_RESULTS)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ToolRefusal("max_results must be a positive integer")
    recency = data.get("recency")
    if recency is not None and recency not in RECENCY:
        raise ToolRefusal(f"recency must be one of {', '.join(RECENCY)}")
    return Query(text=text.strip(), count=min(count, MAX_RESULTS), recency=recency)


def _cascade(ctx: ToolContext, conf: SearchConfig) -> list[str]:
    """The agent's own order (of the configured backends) when it names one, else the operator's."""
    wanted = agent_definition(ctx.agent_def_id).get("search_providers") if ctx.agent_def_id else None
    if isinstance(wanted, list) and wanted:
        return [str(b) for b in wanted if str(b) in conf.backends]
    return list(conf.priority)


def _narrowed(ctx: ToolContext, hits: list[Hit]) -> list[Hit]:
    if ctx.web_search_filter != "drop":
        return hits
    return [h for h in hits if host_matches(_host(h.url), ctx.allowed_hosts)]


def _host(url: str) -> str:
    found = re.match(r"(?i)https?://([^/?#:@]+)", url)
    return found.group(1) if found else ""


def _render(hits: list[Hit]) -> str:
    blocks = []
    for n, hit in enumerate(hits, 1):
        snippet = " ".join(_TAG.sub("", hit.snippet).split())
        if len(snippet) > MAX_SNIPPET_CHARS:
            snippet = snippet[:MAX_SNIPPET_CHARS] + "…"
        title = " ".join(_TAG.sub("", hit.title).split())
        blocks.append(render_untrusted("search_result", f"[{n}] {title} — {hit.url}\n{snippet}"))
    return "\n".join(blocks)


def websearch_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    try:
        conf = search_config(runtime_config())
        if not conf.backends:
            return ToolResult(NOT_CONFIGURED, is_error=True)
        query = _query(data)
        return _run(ctx, conf, query)
    except ToolRefusal as exc:
        return ToolResult(f"WebSearch {exc}", is_error=True)
    except ApplicationError as exc:  # a bad search block in the yaml: the operator's to fix
        return ToolResult(f"WebSearch is misconfigured: {exc.message}", is_error=True)


def _run(ctx: ToolContext, conf: SearchConfig, query: Query) -> ToolResult:
    failures: list[str] = []
    answered = False
    for backend_id in _cascade(ctx, conf):
        backend = conf.backends[backend_id]
        key = (settings.LOOMCYCLE.provider_keys.get(backend.key_env) or "") if backend.key_env else ""
        if backend.key_env and not key:
            continue  # no key: not a failure, just not usable here
        try:
            hits = _narrowed(ctx, search(backend, query, key))
        except SearchFailed as exc:
            failures.append(f"{backend_id}: {exc}")
            continue
        answered = True
        if hits:
            return ToolResult(_render(hits[: query.count]))
    if answered:
        return ToolResult("no results")
    if not failures:
        return ToolResult("WebSearch: no search backend has its key set (e.g. BRAVE_API_KEY)", is_error=True)
    return ToolResult(f"WebSearch: every search backend failed; last: {failures[-1]}", is_error=True)


WEBSEARCH_TOOL = Tool(
    name="WebSearch",
    description=(
        "Search the web (discovery): returns numbered titles, URLs and short snippets, each in a "
        "<search_result> block (untrusted text). Follow up with WebFetch for a page's content."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 100, "description": "default 5, at most 25"},
            "recency": {"type": "string", "enum": list(RECENCY), "description": "only pages from the last ..."},
        },
        "required": ["query"],
    },
    execute=websearch_execute,
)
