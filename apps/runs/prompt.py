"""Prompt segments and transcript rows -> provider-neutral messages (SPEC 7.1).

`parse_segments` is the one parser of a request's `segments`, whichever route
admits the run: loomcycle's nested shape `[{role, content: [block, ...]}]`
and the flat shape this build accepted first (`{role, type, text, kind}`, one
block per entry). Either becomes a list of `Segment`, one block each with its
segment's role. Block types: `trusted-text` (verbatim; `cacheable` marks a
prompt-cache breakpoint), `untrusted-block` (wrapped as `<kind>...</kind>`
with `<` escaped, so untrusted input cannot close its own wrapper; a kind
outside loomcycle's allowlist becomes `untrusted`) and `image` (user role
only; apps.gateway.images checks it). Anything else is a 400 with its own
code, never dropped.

System segments become system blocks; all user segments collapse into ONE
first user message, whose neighbouring text blocks are joined with blank
lines (a cacheable block or an image starts a new block).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from apps.core.errors import Invalid
from apps.gateway import images, vision
from apps.gateway.resolver import Route
from apps.runs.compacted import visible_rows

# loomcycle's allowlist (internal/loop): a kind outside it cannot name the wrapper tag.
UNTRUSTED_KINDS = frozenset(
    {
        "untrusted",
        "web_content",
        "uploaded_cv",
        "qa_question",
        "user_input",
        "tool_output",
        "search_result",
        "run_metadata",
    }
)
BLOCK_TYPES = ("trusted-text", "untrusted-block", "image")
ROLES = ("user", "system")
# What the schemas tell OpenAPI a segment is (the parser, not pydantic, checks it).
SEGMENTS_SCHEMA: dict[str, Any] = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "role": {"type": "string", "enum": list(ROLES)},
            "content": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type"],
                    "properties": {
                        "type": {"type": "string", "enum": list(BLOCK_TYPES)},
                        "text": {"type": "string"},
                        "cacheable": {"type": "boolean"},
                        "kind": {"type": "string"},
                        "media_type": {"type": "string", "enum": list(images.MEDIA_TYPES)},
                        "data": {"type": "string", "description": "image: standard base64, no data: prefix"},
                        "url": {"type": "string", "description": "image: http(s), fetched through the SSRF guard"},
                    },
                },
            },
        },
        "description": "loomcycle's {role, content: [block]}; the flat {role, type, text, kind} is also accepted",
    },
}
NULLABLE_SEGMENTS_SCHEMA: dict[str, Any] = {"anyOf": [SEGMENTS_SCHEMA, {"type": "null"}]}


class PromptBlock(BaseModel):
    """One block of loomcycle's nested `content` (for the API description: parse_segments reads it)."""

    type: Literal["trusted-text", "untrusted-block", "image"]
    text: str = ""
    cacheable: bool = False
    kind: str | None = Field(default=None, description="untrusted-block: the wrapper tag (loomcycle's allowlist)")
    media_type: Literal["image/png", "image/jpeg", "image/gif", "image/webp"] | None = None
    data: str | None = Field(default=None, description="image: standard base64, no data: prefix")
    url: str | None = Field(default=None, description="image: http(s), fetched through the SSRF guard")


class Segment(BaseModel):
    """One block with its segment's role (the flat shape), which is what parse_segments makes of
    loomcycle's nested `{role, content: [block, ...]}`; a request may send either."""

    role: Literal["user", "system"] = "user"
    content: list[PromptBlock] | None = Field(
        default=None, description="loomcycle's shape: this segment's blocks (then the flat fields are not used)"
    )
    type: Literal["trusted-text", "untrusted-block", "image"] = "trusted-text"
    text: str = ""
    kind: str = "untrusted"
    cacheable: bool = False
    media_type: str | None = None
    data: str | None = None
    url: str | None = None
    model_config = {"extra": "ignore"}

    def as_event(self) -> dict[str, Any]:
        """As the `user_input` event keeps it: an image without its bytes (they are in the
        transcript, once), with its size and digest instead."""
        out = self.model_dump(exclude_none=True)
        if self.type == "image" and self.data is not None:
            del out["data"]
            out["bytes"] = images.decoded_size(self.data)
            out["sha256"] = hashlib.sha256(self.data.encode("ascii")).hexdigest()
        return out


def parse_segments(raw: Any) -> list[Segment]:
    """A request's `segments`, checked, as flat segments. 400 `invalid_body` for a wrong
    shape, `unknown_block_type`, `image_not_allowed` (an image outside a user segment),
    and apps.gateway.images' codes for a bad image."""
    if not isinstance(raw, list):
        raise Invalid("segments: must be a list", code="invalid_body")
    out: list[Segment] = []
    for i, item in enumerate(raw):
        where = f"segments[{i}]"
        if not isinstance(item, dict):
            raise Invalid(f"{where}: must be an object", code="invalid_body")
        role = item.get("role", "user")
        if role not in ROLES:
            raise Invalid(f"{where}.role: must be user or system (got {role!r})", code="invalid_body")
        if "content" not in item:
            out.append(_block(item, role, where))
            continue
        content = item["content"]
        if not isinstance(content, list):
            raise Invalid(f"{where}.content: must be a list of blocks", code="invalid_body")
        out.extend(_block(block, role, f"{where}.content[{j}]") for j, block in enumerate(content))
    return out


def _block(block: Any, role: str, where: str) -> Segment:
    if not isinstance(block, dict):
        raise Invalid(f"{where}: a block must be an object", code="invalid_body")
    kind = block.get("type", "trusted-text")
    if kind not in BLOCK_TYPES:
        raise Invalid(
            f"{where}.type: unknown block type {kind!r} (known: {', '.join(BLOCK_TYPES)})",
            code="unknown_block_type",
            details={"type": str(kind)[:64]},
        )
    try:
        segment = Segment.model_validate({**block, "role": role, "type": kind, "content": None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise Invalid(f"{where}.{field}: {first['msg']}", code="invalid_body") from exc
    return _image_checked(segment, where) if kind == "image" else segment


def _image_checked(segment: Segment, where: str) -> Segment:
    if segment.role != "user":
        raise Invalid(f"{where}: an image is allowed only in a user segment", code="image_not_allowed")
    if (segment.data is None) == (segment.url is None):
        raise Invalid(f"{where}: an image needs exactly one of data (base64) or url", code="invalid_image")
    if segment.data is not None:  # line breaks dropped, as loomcycle's decoder ignores them
        return segment.model_copy(update={"data": images.from_base64(segment.media_type, segment.data, where).data})
    images.url_checked(str(segment.url), where)
    if segment.media_type is not None:
        images.media_type_checked(segment.media_type, where)
    return segment


def has_image(segments: Sequence[Segment]) -> bool:
    return any(s.type == "image" for s in segments)


def images_fetched(segments: list[Segment], *, hosts: Sequence[str]) -> list[Segment]:
    """Each image given by URL replaced by its bytes, fetched once at admission (through the
    SSRF guard, reaching only `hosts`), so the run never fetches it again. Blocking."""
    out = []
    for seg in segments:
        if seg.type == "image" and seg.data is None and seg.url:
            where = f"segments: the image url {seg.url[:200]!r}"
            got = images.fetch(seg.url, hosts=hosts, where=where, media_type=seg.media_type)
            seg = seg.model_copy(update={"media_type": got.media_type, "data": got.data})
        out.append(seg)
    return out


def vision_route(route: Route, *, image: bool) -> Route:
    """For a run whose model will see an image (in its prompt or its history): only the route's
    candidates whose model takes images, so no fallback sends one to a model that cannot;
    400 `model_lacks_vision` when none does."""
    if not image:
        return route
    seeing = tuple(c for c in route.candidates if vision.has_vision(c.provider, c.model))
    if not seeing:
        first = route.candidates[0]
        vision.require_vision(first.provider, first.model)
    return dataclasses.replace(route, candidates=seeing)


def prompt_content(segments: list[Segment], *, hosts: Sequence[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """A new run's request system blocks and first user message, each image given by URL
    fetched now (`images_fetched`). Blocking (run creation's thread)."""
    if has_image(segments):
        segments = images_fetched(segments, hosts=hosts)
    return split_segments(segments)


def rows_have_image(rows: Sequence[tuple[str, list[dict[str, Any]]]]) -> bool:
    return any(isinstance(b, dict) and b.get("type") == "image" for _, content in rows for b in content)


def render_untrusted(kind: str, text: str) -> str:
    """SPEC 7.1's untrusted block: `<kind>` (an allowlisted kind, else `untrusted`) around the
    text with every `<` escaped, so the text cannot close the block. WebSearch's hits use it too."""
    kind = kind if kind in UNTRUSTED_KINDS else "untrusted"
    return f"<{kind}>\n{text.replace('<', '&lt;')}\n</{kind}>"


def _render(segment: Segment) -> str:
    if segment.type == "untrusted-block":
        return render_untrusted(segment.kind or "untrusted", segment.text)
    return segment.text


def split_segments(segments: list[Segment]) -> tuple[list[str], list[dict[str, Any]]]:
    """-> (system blocks, the content of the single first user message)."""
    system = [_render(s) for s in segments if s.role == "system"]
    content = user_content([s for s in segments if s.role == "user"])
    if not any(b["type"] == "image" or b["text"].strip() for b in content):
        raise Invalid("no input: prompt or a user segment is required", code="invalid_body")
    return system, content


def user_content(segments: list[Segment]) -> list[dict[str, Any]]:
    """Neutral blocks: text joined with blank lines up to a cacheable block or an image. Only the
    last cacheable block keeps its mark: caching is by prefix, and Anthropic allows 4 breakpoints."""
    blocks: list[dict[str, Any]] = []
    joinable = False
    for seg in segments:
        if seg.type == "image":
            blocks.append({"type": "image", "media_type": seg.media_type, "data": seg.data})
            joinable = False
        elif joinable and not seg.cacheable:
            blocks[-1]["text"] += "\n\n" + _render(seg)
        else:
            blocks.append({"type": "text", "text": _render(seg), **({"cacheable": True} if seg.cacheable else {})})
            joinable = not seg.cacheable
    marked = [b for b in blocks if b.get("cacheable")]
    for block in marked[:-1]:
        del block["cacheable"]
    return [b for b in blocks if b["type"] == "image" or b["text"]]


def system_blocks(agent_prompt: str, request_system: list[str], metadata: dict[str, Any]) -> list[str]:
    blocks = [agent_prompt] if agent_prompt.strip() else []
    blocks.extend(request_system)
    if metadata:
        blocks.append("Run metadata (operator-authored, trusted):\n" + json.dumps(metadata, sort_keys=True))
    return blocks


def messages_from_rows(rows: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Merge consecutive same-role rows (tool results after one assistant turn
    become one user message, as the provider APIs require), after the latest
    compaction marker's rebuild (apps.runs.compacted.visible)."""
    messages: list[dict[str, Any]] = []
    for role, content in visible_rows(rows):
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(content)
        else:
            messages.append({"role": role, "content": list(content)})
    return messages
