"""Image input (loomcycle's `image` prompt block, the gateway's `image_url` part):
the checks every image passes before any provider sees it, and the fetch of an
image given by URL.

An image is one of the media types all four vision drivers accept (png, jpeg,
gif, webp), standard base64 with no `data:` prefix (line breaks are dropped), and at most
LOOMCYCLE_MAX_IMAGE_BYTES decoded. A URL (http or https only) is fetched
through the SSRF guard (apps.core.egress) with the host list the caller gives
(a run's effective `allowed_hosts`), at most that many bytes read and at most
LOOMCYCLE_IMAGE_FETCH_TIMEOUT_MS; its Content-Type must be one of the four
types. Every refusal is a 400 with its own code, never a silent drop.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from django.conf import settings

from apps.core import egress
from apps.core.errors import Invalid

MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
_DATA_URI = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)", re.DOTALL)
_MAX_REDIRECTS = 3


@dataclass(frozen=True)
class Image:
    media_type: str
    data: str  # standard base64, no data: prefix
    size: int  # decoded bytes


def max_bytes() -> int:
    return int(settings.LOOMCYCLE.max_image_bytes)


def decoded_size(data: str) -> int:
    """The decoded size of checked base64 `data`, from its length."""
    return len(data) * 3 // 4 - data[-2:].count("=")


def _too_large(where: str, size: int) -> Invalid:
    limit = max_bytes()
    return Invalid(
        f"{where}: the image is {size} bytes, over the {limit}-byte limit (LOOMCYCLE_MAX_IMAGE_BYTES)",
        code="image_too_large",
        details={"bytes": size, "max_bytes": limit},
    )


def media_type_checked(media_type: str | None, where: str) -> str:
    if media_type not in MEDIA_TYPES:
        raise Invalid(
            f"{where}: unsupported image media_type {media_type!r} (allowed: {', '.join(MEDIA_TYPES)})",
            code="unsupported_image_type",
        )
    return media_type


def from_base64(media_type: str | None, data: str, where: str) -> Image:
    """A base64 image, checked: its type, its encoding, its decoded size (the size is
    known from the length before anything is decoded, so an oversized one costs nothing)."""
    kind = media_type_checked(media_type, where)
    data = data.replace("\r", "").replace("\n", "")  # wrapped base64 (76-column lines), as Go's decoder allows
    if not data:
        raise Invalid(f"{where}: an image needs data (base64) or url", code="invalid_image")
    estimate = decoded_size(data)
    if estimate > max_bytes():
        raise _too_large(where, estimate)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Invalid(f"{where}: image data is not valid standard base64 ({exc})", code="invalid_image") from exc
    if not raw:
        raise Invalid(f"{where}: the image is empty", code="invalid_image")
    return Image(media_type=kind, data=data, size=len(raw))


def from_data_uri(uri: str, where: str) -> Image:
    """`data:<type>;base64,<data>` (the gateway's image_url form for inline bytes)."""
    match = _DATA_URI.fullmatch(uri)
    if match is None:
        raise Invalid(f"{where}: a data: URL must be data:<image type>;base64,<data>", code="invalid_image")
    return from_base64(match["type"], match["data"], where)


def url_checked(url: str, where: str) -> str:
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in ("http", "https"):
        raise Invalid(f"{where}: an image url must be http or https", code="invalid_image")
    return url


def fetch(url: str, *, hosts: Sequence[str], where: str, media_type: str | None = None) -> Image:
    """GET the image at `url` through the SSRF guard, reaching only `hosts` (`[]`: none).
    Blocking: called from worker threads and the sync half of run creation."""
    url_checked(url, where)
    if media_type is not None:
        media_type_checked(media_type, where)
    policy = egress.operator_policy(tuple(hosts))
    timeout = settings.LOOMCYCLE.image_fetch_timeout_ms / 1000
    try:
        with egress.client(policy=policy, timeout=timeout, max_redirects=_MAX_REDIRECTS) as client:
            with client.stream("GET", url) as resp:
                if resp.status_code != 200:
                    raise Invalid(f"{where}: fetching the image answered {resp.status_code}", code="image_fetch_failed")
                got = resp.headers.get("content-type", "").split(";")[0].strip().lower()
                raw = _read_capped(resp, where)
    except egress.EgressRefused as exc:
        raise Invalid(f"{where}: the image url is refused: {exc.reason}", code="image_url_refused") from exc
    except httpx.HTTPError as exc:
        raise Invalid(f"{where}: fetching the image failed: {exc}", code="image_fetch_failed") from exc
    kind = media_type_checked(got, f"{where} (the server's Content-Type)")
    if media_type is not None and media_type != kind:
        raise Invalid(f"{where}: media_type {media_type!r} but the server sent {kind!r}", code="unsupported_image_type")
    if not raw:
        raise Invalid(f"{where}: the image is empty", code="invalid_image")
    return Image(media_type=kind, data=base64.b64encode(raw).decode("ascii"), size=len(raw))


def _read_capped(resp: httpx.Response, where: str) -> bytes:
    limit = max_bytes()
    declared = resp.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(where, int(declared))
    chunks: list[bytes] = []
    total = 0
    for chunk in resp.iter_bytes():
        total += len(chunk)
        if total > limit:
            raise _too_large(where, total)
        chunks.append(chunk)
    return b"".join(chunks)
