"""The web-search backends the `WebSearch` tool calls (loomcycle's search catalog, RFC BB):
the operator's yaml `search_providers:` (which backends, with their settings) and
`search_priority:` (the fallback order). Each backend is a plain HTTP client speaking its
service's JSON API; every request goes through the SSRF guard (apps.core.egress) under
the operator's policy: any public host, a private one only when
LOOMCYCLE_HTTP_PRIVATE_HOST_ALLOWLIST names it (a SearXNG on the operator's network).

- `searxng` (self-hosted, keyless): `GET {base_url}/search?q=&format=json[&time_range=]`,
  hits under `results[]` (`title`, `url`, `content`).
- `brave` (hosted): `GET https://api.search.brave.com/res/v1/web/search?q=&count=[&freshness=]`
  with the key (BRAVE_API_KEY) in `X-Subscription-Token`, hits under `web.results[]`
  (`title`, `url`, `description`). `base_url` replaces the endpoint (a proxy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings

from apps.core import egress
from apps.core.errors import Invalid

MAX_RESPONSE_BYTES = 1024 * 1024
TIMEOUT_S = 15.0
RECENCY = ("day", "week", "month", "year")
BRAVE_ENDPOINT = "https://api.search.brave.com/res/v1/web/search"
_BRAVE_FRESHNESS = {"day": "pd", "week": "pw", "month": "pm", "year": "py"}


class SearchFailed(Exception):
    """A backend did not answer usably (network, refusal, status, body): the tool falls over."""


@dataclass(frozen=True)
class Hit:
    title: str
    url: str
    snippet: str


@dataclass(frozen=True)
class Query:
    text: str
    count: int
    recency: str | None


@dataclass(frozen=True)
class Backend:
    id: str
    endpoint: str
    key_env: str  # the provider_keys name of its key; "" = keyless
    build: Callable[[Backend, Query, str], httpx.Request]
    parse: Callable[[Any], list[Hit]]


def _searxng_request(backend: Backend, query: Query, key: str) -> httpx.Request:
    params = {"q": query.text, "format": "json"}
    if query.recency:
        params["time_range"] = query.recency
    return httpx.Request("GET", backend.endpoint, params=params, headers={"Accept": "application/json"})


def _searxng_hits(body: Any) -> list[Hit]:
    rows = body.get("results") if isinstance(body, dict) else None
    return [_hit(r, "content") for r in rows or [] if isinstance(r, dict)]


def _brave_request(backend: Backend, query: Query, key: str) -> httpx.Request:
    params = {"q": query.text, "count": str(min(query.count, 20))}
    if query.recency:
        params["freshness"] = _BRAVE_FRESHNESS[query.recency]
    headers = {"Accept": "application/json", "X-Subscription-Token": key}
    return httpx.Request("GET", backend.endpoint, params=params, headers=headers)


def _brave_hits(body: Any) -> list[Hit]:
    web = body.get("web") if isinstance(body, dict) else None
    rows = web.get("results") if isinstance(web, dict) else None
    return [_hit(r, "description") for r in rows or [] if isinstance(r, dict)]


def _hit(row: dict[str, Any], snippet_key: str) -> Hit:
    return Hit(
        title=str(row.get("title") or ""), url=str(row.get("url") or ""), snippet=str(row.get(snippet_key) or "")
    )


# --- configuration -----------------------------------------------------------------------


def _url(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.lower().startswith(("http://", "https://")):
        raise Invalid(f"{where}: must be an http or https URL", code="config_invalid")
    return value.rstrip("/")


def _backend(backend_id: str, raw: Any) -> Backend:
    where = f"search_providers.{backend_id}"
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise Invalid(f"{where}: must be a mapping", code="config_invalid")
    unknown = sorted(set(raw) - {"base_url"})
    if unknown:
        raise Invalid(f"{where}: unknown fields {unknown}", code="config_invalid")
    if backend_id == "searxng":
        if "base_url" not in raw:
            raise Invalid(f"{where}: base_url is required for the self-hosted SearXNG", code="config_invalid")
        base = _url(raw["base_url"], f"{where}.base_url")
        return Backend("searxng", base + "/search", "", _searxng_request, _searxng_hits)
    if backend_id == "brave":
        endpoint = _url(raw["base_url"], f"{where}.base_url") if "base_url" in raw else BRAVE_ENDPOINT
        return Backend("brave", endpoint, "BRAVE_API_KEY", _brave_request, _brave_hits)
    raise Invalid(
        f"search_providers: unknown provider {backend_id!r} (this build has brave, searxng)", code="config_invalid"
    )


@dataclass(frozen=True)
class SearchConfig:
    backends: dict[str, Backend]
    priority: tuple[str, ...]  # the fallback order when an agent names none


def search_config(config: dict[str, Any]) -> SearchConfig:
    """The yaml's search blocks (config_invalid on a bad one). With no `search_providers:`,
    Brave when BRAVE_API_KEY is set (loomcycle's back-compat), else nothing."""
    block = config.get("search_providers")
    if block is None and settings.LOOMCYCLE.provider_keys.get("BRAVE_API_KEY"):
        block = {"brave": {}}
    if not isinstance(block or {}, dict):
        raise Invalid("`search_providers:` must be a mapping of provider -> settings", code="config_invalid")
    backends = {str(k): _backend(str(k), v) for k, v in (block or {}).items()}
    priority = config.get("search_priority") or list(backends)
    if not isinstance(priority, list):
        raise Invalid("`search_priority:` must be a list of search_providers names", code="config_invalid")
    for i, name in enumerate(priority):
        if name not in backends:
            raise Invalid(f"search_priority[{i}]: {name!r} is not a search_providers entry", code="config_invalid")
    return SearchConfig(backends=backends, priority=tuple(str(p) for p in priority))


# --- a call ------------------------------------------------------------------------------


def search(backend: Backend, query: Query, key: str) -> list[Hit]:
    """One backend's hits for `query`; SearchFailed on anything but a readable 200."""
    policy = egress.operator_policy(None)  # any public host; private ones only when allowlisted
    request = backend.build(backend, query, key)
    try:
        with egress.client(policy=policy, timeout=TIMEOUT_S) as client:
            response = client.send(request, stream=True)
            try:
                body = _read_capped(response)
            finally:
                response.close()
    except egress.EgressRefused as exc:
        raise SearchFailed(f"refused: {exc.reason}") from exc
    except httpx.HTTPError as exc:
        raise SearchFailed(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise SearchFailed(f"status {response.status_code}")
    try:
        return backend.parse(httpx.Response(200, content=body).json())
    except ValueError as exc:
        raise SearchFailed("the reply is not JSON") from exc


def _read_capped(response: httpx.Response) -> bytes:
    out = bytearray()
    for chunk in response.iter_bytes():
        out += chunk
        if len(out) > MAX_RESPONSE_BYTES:
            raise SearchFailed(f"the reply exceeds {MAX_RESPONSE_BYTES} bytes")
    return bytes(out)
