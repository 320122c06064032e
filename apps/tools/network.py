"""The network tools `HTTP` and `WebFetch` (SPEC 6.10), thin adapters over
apps.tools.httpcall. Both refuse every call while the operator has not
configured the network (SPEC 6.1 layer 1), and every call of a run whose
allowed hosts are empty, before any lookup or byte is sent."""

from __future__ import annotations

import re
from typing import Any

from selectolax.lexbor import LexborHTMLParser

from apps.core import hosts
from apps.core.tools import Tool, ToolContext, ToolRefusal, ToolResult
from apps.tools import httpcall
from apps.tools.httpcall import MAX_BYTES, Fetched, Outbound

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")
_HTTP_FIELDS = frozenset({"method", "url", "headers", "body"})
# Headers the model may not set: they would change where or how the request goes
# (Host picks a virtual host behind the checked address), not what it says.
_REFUSED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "keep-alive"}
    | {"proxy-authorization", "proxy-connection"}
)
NOT_CONFIGURED = (
    "{tool} is not configured: set LOOMCYCLE_HTTP_HOST_ALLOWLIST (hosts this runtime may reach, `*` for any "
    "public host), or LOOMCYCLE_HTTP_CALLER_AUTHORITATIVE=1 to let each run's allowed_hosts decide"
)
NO_HOSTS = (
    "{tool} refused: this run may reach no host (its allowed_hosts is empty: the caller sent [] "
    "or none of its hosts is within LOOMCYCLE_HTTP_HOST_ALLOWLIST)"
)


def _gate(tool: str, ctx: ToolContext) -> ToolResult | None:
    """The operator floor and the run's host list, checked before the input."""
    if not hosts.network_configured():
        return ToolResult(NOT_CONFIGURED.format(tool=tool), is_error=True)
    if not ctx.allowed_hosts:
        return ToolResult(NO_HOSTS.format(tool=tool), is_error=True)
    return None


def _url(data: dict[str, Any]) -> str:
    url = data.get("url")
    if not isinstance(url, str) or not url.strip():
        raise ToolRefusal("url is required (an http or https URL)")
    if not re.match(r"(?i)https?://", url.strip()):
        raise ToolRefusal(f"url {url!r} must start with http:// or https://")
    return url.strip()


def _headers(raw: Any, ctx: ToolContext) -> tuple[dict[str, str], frozenset[str]]:
    if raw is None:
        return {}, frozenset()
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise ToolRefusal("headers must be an object of string names to string values")
    out: dict[str, str] = {}
    secret: set[str] = set()
    for name, template in raw.items():
        if name.strip().lower() in _REFUSED_HEADERS:
            raise ToolRefusal(f"header {name!r} may not be set by the tool call")
        out[name], used = httpcall.substitute(template, ctx.credentials)
        if used:
            secret.add(name.lower())
    return out, frozenset(secret)


def _http_outbound(ctx: ToolContext, data: dict[str, Any]) -> Outbound:
    unknown = sorted(set(data) - _HTTP_FIELDS)
    if unknown:
        raise ToolRefusal(f"unknown fields {unknown}; HTTP takes method, url, headers, body")
    method = str(data.get("method") or "GET").upper()
    if method not in METHODS:
        raise ToolRefusal(f"method {data.get('method')!r} is not one of {', '.join(METHODS)}")
    url = _url(data)
    body = data.get("body")
    if body is not None and not isinstance(body, str):
        raise ToolRefusal("body must be a string")
    encoded = body.encode("utf-8") if body is not None else None
    if encoded is not None and len(encoded) > MAX_BYTES:
        raise ToolRefusal(f"request body is {len(encoded)} bytes; the cap is {MAX_BYTES}")
    headers, secret = _headers(data.get("headers"), ctx)
    return Outbound(method=method, url=url, headers=headers, secret_headers=secret, body=encoded)


def http_text(out: Outbound, fetched: Fetched) -> str:
    """SPEC 6.10: `HTTP <METHOD> <url> -> <status>`, the response headers, a blank line, the body."""
    lines = [f"HTTP {out.method} {out.url} -> {fetched.status}"]
    lines += [f"{name}: {value}" for name, value in fetched.headers]
    text = "\n".join(lines) + "\n\n" + httpcall.decode(fetched)
    if fetched.truncated:
        text += f"\n[truncated at {MAX_BYTES} bytes]"
    return text


def http_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    refused = _gate("HTTP", ctx)
    if refused:
        return refused
    try:
        out = _http_outbound(ctx, data)
        fetched = httpcall.fetch(ctx, out)
    except ToolRefusal as exc:
        return ToolResult(httpcall.redact_credentials(f"HTTP {exc}", ctx.credentials), is_error=True)
    return ToolResult(httpcall.redact_credentials(http_text(out, fetched), ctx.credentials))


# WebFetch: readable text of a page.

_DROPPED = ["script", "style", "noscript", "template", "svg", "iframe", "object", "canvas"]
_BLOCKS = (
    "p,div,br,li,tr,h1,h2,h3,h4,h5,h6,section,article,header,footer,nav,aside,main,pre,blockquote,"
    "table,ul,ol,dl,dt,dd,hr,figure,figcaption,form,address"
)
_HTML_TYPES = ("text/html", "application/xhtml+xml")
_BREAK = "\ue000"  # a private-use character marking the end of a block element


def readable_text(html: str) -> str:
    """The page's title and body text: script, style and similar elements
    dropped, entities decoded by the parser, whitespace (non-breaking spaces
    too) collapsed to one space, one line per block element, no blank lines."""
    tree = LexborHTMLParser(html)
    title_node = tree.css_first("title")
    title = " ".join(title_node.text().split()) if title_node is not None else ""
    tree.strip_tags(_DROPPED)
    for node in tree.css(_BLOCKS):
        node.insert_after(_BREAK)
    root = tree.body or tree.root
    raw = root.text(separator="", deep=True) if root is not None else ""
    lines = (" ".join(line.split()) for line in raw.split(_BREAK))
    text = "\n".join(line for line in lines if line)
    return f"{title}\n\n{text}" if title else text


def _is_html(fetched: Fetched, text: str) -> bool:
    ctype = fetched.content_type.split(";", 1)[0].strip().lower()
    if ctype:
        return ctype in _HTML_TYPES
    return bool(re.match(r"\s*(<!doctype html|<html)", text, re.IGNORECASE))


def _capped(text: str) -> tuple[str, bool]:
    raw = text.encode("utf-8")
    if len(raw) <= MAX_BYTES:
        return text, False
    return raw[:MAX_BYTES].decode("utf-8", errors="ignore"), True


def webfetch_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    refused = _gate("WebFetch", ctx)
    if refused:
        return refused
    try:
        unknown = sorted(set(data) - {"url"})
        if unknown:
            raise ToolRefusal(f"unknown fields {unknown}; WebFetch takes url")
        out = Outbound(method="GET", url=_url(data), headers={}, secret_headers=frozenset())
        fetched = httpcall.fetch(ctx, out)
    except ToolRefusal as exc:
        return ToolResult(f"WebFetch {exc}", is_error=True)
    body = httpcall.decode(fetched)
    text, truncated = _capped(readable_text(body) if _is_html(fetched, body) else body)
    result = f"HTTP GET {out.url} -> {fetched.status}\n\n{text}"
    if truncated or fetched.truncated:
        result += "\n[truncated]"
    return ToolResult(httpcall.redact_credentials(result, ctx.credentials))


HTTP_TOOL = Tool(
    name="HTTP",
    description=(
        "Make an HTTP request to an allowed host. Output: `HTTP <METHOD> <url> -> <status>`, the response "
        "headers, a blank line, then the body (capped at 256 KiB). Header values may use ${run.user_bearer} "
        "or ${run.credentials.<name>} (with :-fallback); their values are never shown."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "method": {"type": "string", "enum": list(METHODS), "default": "GET"},
            "url": {"type": "string", "description": "http or https URL"},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "body": {"type": "string", "description": "request body, at most 256 KiB"},
        },
        "required": ["url"],
    },
    execute=http_execute,
)

WEBFETCH_TOOL = Tool(
    name="WebFetch",
    description=(
        "Fetch a web page from an allowed host and return its readable text (scripts, styles and tags "
        "removed), capped at 256 KiB."
    ),
    input_schema={
        "type": "object",
        "properties": {"url": {"type": "string", "description": "http or https URL"}},
        "required": ["url"],
    },
    execute=webfetch_execute,
)
