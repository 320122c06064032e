"""One outbound HTTP call for the network tools (SPEC 6.10), through the SSRF
guard (apps.core.egress).

Invariants:
- the run's `allowed_hosts` (ToolContext) and the operator's private-host
  allowlist form the HostPolicy; every hop is checked by the guard;
- the request body is at most MAX_BYTES; the response body is read up to
  MAX_BYTES and the rest is never read (nor are redirect bodies);
- at most MAX_REDIRECTS redirects, followed here one by one (never by httpx,
  which would read each redirect's whole body): a redirect to another origin
  drops the headers that carried a run credential;
- `${run.user_bearer}` / `${run.credentials.<name>}` (with `:-fallback`) are
  substituted in header values only, at request time; the values never appear
  in what the tool returns (`redact_credentials`); a substituted value that is
  not a valid header value is refused before sending, quoting the template only;
- `Accept-Encoding: identity` is sent unless the call set one; a gzip or
  deflate body is inflated here with a bounded decompressor (never more than
  MAX_BYTES + 1 bytes at a time), any other encoding is refused.
"""

from __future__ import annotations

import re
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx
from django.conf import settings

from apps.core import egress
from apps.core.tools import ToolContext, ToolRefusal

MAX_BYTES = 256 * 1024
TIMEOUT_S = 30.0
MAX_REDIRECTS = 5

_HEADER_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\t\x20-\x7e]*[\x21-\x7e])?)?")  # RFC 9110, ASCII
_ZLIB_WBITS = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}
_TEMPLATE = re.compile(r"\$\{run\.(user_bearer|credentials\.([A-Za-z0-9_.-]{1,128}))(?::-([^}]*))?\}")


@dataclass(frozen=True)
class Outbound:
    method: str
    url: str
    headers: dict[str, str]  # as sent: templates substituted
    secret_headers: frozenset[str]  # lower-case names of headers that carry a credential
    body: bytes | None = None


@dataclass(frozen=True)
class Fetched:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    truncated: bool
    content_type: str
    encoding: str


def substitute(value: str, credentials: Mapping[str, str]) -> tuple[str, bool]:
    """`value` with its credential templates filled in, and whether it used one.
    A template whose credential is absent or empty takes its fallback; without
    one the call is refused (never sent with an empty secret)."""
    used = False

    def fill(match: re.Match[str]) -> str:
        nonlocal used
        key = "user_bearer" if match.group(1) == "user_bearer" else match.group(2)
        found = credentials.get(key, "")
        if found:
            used = True
            return found
        if match.group(3) is not None:
            return match.group(3)
        raise ToolRefusal(
            f"header template {match.group(0)!r} names a credential this run does not carry "
            "(pass it as user_bearer / user_credentials on POST /v1/runs, or add a :-fallback)"
        )

    filled = _TEMPLATE.sub(fill, value)
    if not _HEADER_VALUE.fullmatch(filled):
        what = "with its credentials filled in " if used else ""
        raise ToolRefusal(
            f"header value {value!r} {what}is not a valid HTTP header value "
            "(printable ASCII only, no control characters, no leading or trailing whitespace)"
        )
    return filled, used


def redact_credentials(text: str, credentials: Mapping[str, str]) -> str:
    """Every credential value of the run in `text` replaced by a marker naming it."""
    for name, value in sorted(credentials.items(), key=lambda kv: -len(kv[1])):
        if value:
            marker = "run.user_bearer" if name == "user_bearer" else f"run.credentials.{name}"
            text = text.replace(value, f"[redacted:{marker}]")
    return text


def policy_for(ctx: ToolContext) -> egress.HostPolicy:
    return egress.HostPolicy(
        allowed=ctx.allowed_hosts, private_allowlist=tuple(settings.LOOMCYCLE.http_private_host_allowlist)
    )


def fetch(ctx: ToolContext, out: Outbound, *, timeout: float = TIMEOUT_S) -> Fetched:
    """Send `out` and read the capped response; every failure is a ToolRefusal
    with a reason the model can act on."""
    deadline = time.monotonic() + timeout
    try:
        with egress.client(policy=policy_for(ctx), timeout=timeout, follow_redirects=False) as client:
            response = _send_following(client, out, ctx, deadline, timeout)
            try:
                return _read_capped(response, ctx, deadline, timeout)
            finally:
                response.close()
    except egress.EgressRefused as exc:
        raise ToolRefusal(f"refused: {exc.reason}") from exc
    except httpx.TimeoutException as exc:
        raise ToolRefusal(f"timed out after {timeout:g} s ({type(exc).__name__})") from exc
    except httpx.HTTPError as exc:
        raise ToolRefusal(f"request failed: {type(exc).__name__}: {exc}") from exc
    except httpx.InvalidURL as exc:
        raise ToolRefusal(f"invalid url: {exc}") from exc
    except UnicodeEncodeError as exc:  # before UnicodeError: never quote the text (it may hold a credential)
        raise ToolRefusal(f"a header name or value is not ASCII ({exc.reason}); only ASCII can be sent") from exc
    except UnicodeError as exc:  # idna: a host name that is not a valid international domain name
        raise ToolRefusal(f"invalid host name in url: {exc}") from exc


def _send_following(
    client: httpx.Client, out: Outbound, ctx: ToolContext, deadline: float, timeout: float
) -> httpx.Response:
    headers = dict(out.headers)
    if not any(name.lower() == "accept-encoding" for name in headers):
        headers["Accept-Encoding"] = "identity"
    request = client.build_request(out.method, out.url, headers=headers, content=out.body)
    origin = request.url.copy_with(path="/", query=None, fragment=None)
    for _ in range(MAX_REDIRECTS + 1):
        _check_time(ctx, deadline, timeout)
        response = client.send(request, stream=True)
        following = response.next_request
        if following is None:
            return response
        response.close()  # a redirect's body is never read
        if following.url.copy_with(path="/", query=None, fragment=None) != origin:
            for name in out.secret_headers:
                following.headers.pop(name, None)
        request = following
    raise ToolRefusal(f"more than {MAX_REDIRECTS} redirects (last to {request.url})")


def _read_capped(response: httpx.Response, ctx: ToolContext, deadline: float, timeout: float) -> Fetched:
    inflate = _inflater(response.headers.get("content-encoding", ""))
    body = bytearray()
    for chunk in response.iter_raw():
        _check_time(ctx, deadline, timeout)
        body.extend(inflate(chunk, MAX_BYTES + 1 - len(body)))
        if len(body) > MAX_BYTES:
            break
    truncated = len(body) > MAX_BYTES
    del body[MAX_BYTES:]
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw]
    return Fetched(
        status=response.status_code,
        headers=headers,
        body=bytes(body),
        truncated=truncated,
        content_type=response.headers.get("content-type", ""),
        encoding=response.encoding or "utf-8",
    )


def _inflater(content_encoding: str) -> Callable[[bytes, int], bytes]:
    """A function(raw chunk, limit) giving at most `limit` decoded bytes of the
    body: identity as is, gzip and deflate through a bounded zlib decompressor
    (a small chunk never inflates past `limit` in memory); ToolRefusal for any
    other encoding."""
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return lambda chunk, limit: chunk[: max(limit, 0)]
    if coding not in _ZLIB_WBITS:
        raise ToolRefusal(
            f"the response uses Content-Encoding {content_encoding!r}, which the tool does not decode "
            "(send Accept-Encoding: identity, gzip or deflate)"
        )
    return _Inflater(coding).inflate


class _Inflater:
    """A bounded zlib decompressor for one body; `deflate` falls back to raw
    deflate when the first chunk is not zlib-wrapped (as httpx does)."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self.decompressor = zlib.decompressobj(_ZLIB_WBITS[coding])
        self.started = False

    def inflate(self, chunk: bytes, limit: int) -> bytes:
        """At most `limit` decoded bytes of `chunk` (the rest is never inflated)."""
        if limit <= 0 or not chunk:
            return b""
        try:
            out = self.decompressor.decompress(chunk, limit)
        except zlib.error as exc:
            if self.coding != "deflate" or self.started:
                raise ToolRefusal(f"the response body is not valid {self.coding}: {exc}") from exc
            self.decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
            self.started = True
            return self.inflate(chunk, limit)
        self.started = True
        return out


def _check_time(ctx: ToolContext, deadline: float, timeout: float) -> None:
    if ctx.cancelled.is_set():
        raise ToolRefusal("cancelled: the run was cancelled")
    if time.monotonic() > deadline:
        raise ToolRefusal(f"timed out after {timeout:g} s")


def decode(fetched: Fetched) -> str:
    try:
        return fetched.body.decode(fetched.encoding, errors="replace")
    except LookupError:  # a charset Python does not know
        return fetched.body.decode("utf-8", errors="replace")
