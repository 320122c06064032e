"""`loomcycle.yaml` loading: layered files, `${ENV}` expansion (SPEC C.1);
`<name>.md` definition files (appendix D); the `channels:` block as
ChannelDef rows (SPEC 9.4). Versioned kinds are loaded by services."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.core.errors import Invalid
from apps.substrate.kinds import Refused
from apps.substrate.kinds.fields import check_channel_name, is_system_channel
from apps.substrate.models import ChannelDef, DefSource

log = logging.getLogger("loomcycle.substrate")

# --- `<name>.md` definitions (SPEC appendix D) ----------------------------------


def split_frontmatter(text: str, where: str) -> tuple[dict[str, Any], str]:
    """`---\\n<yaml>\\n---\\n<body>` -> (frontmatter, body); no leading `---` means body only.
    A bad frontmatter is config_invalid naming `where` and the line in the file."""
    head, body = _frontmatter_parts(text, where)
    if head is None:
        return {}, body
    try:
        meta = yaml.safe_load(head) or {}
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or type(exc).__name__
        raise Invalid(f"{where}:{_file_line(exc)}: invalid frontmatter: {problem}", code="config_invalid") from exc
    if not isinstance(meta, dict):
        raise Invalid(f"{where}:2: frontmatter must be a mapping", code="config_invalid")
    return meta, body


def _frontmatter_parts(text: str, where: str) -> tuple[str | None, str]:
    text = text.replace("\r\n", "\n")
    if not text.startswith("---\n"):
        return None, text
    rest = text[len("---\n") :]
    end = rest.find("\n---\n")
    if end >= 0:
        return rest[:end], rest[end + len("\n---\n") :]
    if rest.endswith("\n---"):
        return rest[: -len("\n---")], ""
    raise Invalid(f"{where}:1: frontmatter has no closing ---", code="config_invalid")


def _file_line(exc: yaml.YAMLError) -> int:
    """The file line of a frontmatter yaml error (the frontmatter starts on line 2)."""
    mark = getattr(exc, "problem_mark", None)
    return mark.line + 2 if mark is not None else 2


def frontmatter_key_lines(text: str) -> dict[str, int]:
    """Each top-level frontmatter key's line in the file (for errors that name a field)."""
    head, _ = _frontmatter_parts(text, "")
    if not head:
        return {}
    node = yaml.compose(head, Loader=yaml.SafeLoader)
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(k.value): k.start_mark.line + 2 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def definition_from_markdown(kind_key: str, path: Path) -> tuple[str, dict[str, Any]]:
    """An agent `<name>.md` (body = system prompt) or a skill `SKILL.md`
    (body = skill body) as (name, raw definition). The name defaults to the
    file name (the directory name for SKILL.md) and must match it if given."""
    meta, body = split_frontmatter(path.read_text(), str(path))
    default = path.parent.name if path.name == "SKILL.md" else path.stem
    name = meta.pop("name", None) or default
    if name != default:
        raise Invalid(f"{path}: frontmatter name {name!r} != file name {default!r}", code="config_invalid")
    if kind_key == "agent":
        if meta.get("allowed_tools") is not None:  # the list form wins over Claude Code's `tools`
            meta["tools"] = meta.pop("allowed_tools")
        prompt_file = meta.pop("system_prompt_file", None)
        if prompt_file and body.strip():
            raise Invalid(f"{path}: a body and system_prompt_file are mutually exclusive", code="config_invalid")
        if prompt_file:
            body = (path.parent / str(prompt_file)).read_text()
        meta.pop("system_prompt", None)  # not read from frontmatter: the body is the prompt
        return name, {**meta, "system_prompt": body}
    if kind_key == "skill":
        tools = meta.pop("allowed_tools", None) or meta.pop("allowed-tools", None) or meta.get("tools")
        if isinstance(tools, str):
            tools = [t.strip() for t in tools.split(",") if t.strip()]
        return name, {**{k: v for k, v in meta.items() if k != "tools"}, "tools": tools or [], "body": body}
    raise Invalid(f"{path}: a .md file describes an agent or a skill, not a {kind_key}", code="config_invalid")


# --- `channels:` (SPEC 9.4) -------------------------------------------------------

CHANNEL_FIELDS = frozenset({"scope", "semantic", "default_ttl", "max_messages", "publisher", "period", "description"})
CHANNEL_SEMANTICS = ("queue", "broadcast", "topic")


def _channel_count(raw: dict[str, Any], key: str, where: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Invalid(f"{where}: {key} must be a non-negative integer (got {value!r})", code="config_invalid")
    return value or None  # 0: no limit


def _channel_text(raw: dict[str, Any], key: str, where: str) -> str:
    value = raw.get(key) or ""
    if not isinstance(value, str):
        raise Invalid(f"{where}: {key} must be a string", code="config_invalid")
    return value


def channel_fields_from_yaml(name: Any, raw: Any) -> dict[str, Any]:
    """One `channels:` entry as ChannelDef field values; raises Invalid(config_invalid)."""
    where = f"channels.{name}"
    try:
        check_channel_name(name, where)
    except Refused as exc:
        raise Invalid(exc.message, code="config_invalid") from exc
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise Invalid(f"{where}: must be a mapping", code="config_invalid")
    unknown = sorted(set(raw) - CHANNEL_FIELDS)
    if unknown:
        log.warning("%s: ignoring fields this build does not know: %s", where, unknown)
    scope = raw.get("scope") or "global"
    if scope not in ("agent", "user", "global", "tenant"):
        raise Invalid(f"{where}: scope must be agent, user, global or tenant (got {scope!r})", code="config_invalid")
    semantic = raw.get("semantic") or "queue"
    if semantic not in CHANNEL_SEMANTICS:
        raise Invalid(f"{where}: semantic must be queue, broadcast or topic (got {semantic!r})", code="config_invalid")
    publisher = _channel_text(raw, "publisher", where)
    if is_system_channel(str(name)) and publisher != "system":
        raise Invalid(f"{where}: names under _system/ are reserved for `publisher: system`", code="config_invalid")
    return {
        "scope": scope,
        "semantic": semantic,
        "default_ttl_seconds": _channel_count(raw, "default_ttl", where),
        "max_messages": _channel_count(raw, "max_messages", where),
        "publisher": publisher,
        "period": _channel_text(raw, "period", where),
        "description": _channel_text(raw, "description", where),
    }


@dataclass(frozen=True)
class ChannelSync:
    created: list[str]
    updated: list[str]
    deleted: list[str]


@transaction.atomic
def channel_defs_sync_yaml(*, config: dict[str, Any]) -> ChannelSync:
    """Upsert the `channels:` block as shared-tenant ChannelDef rows tagged
    yaml. Idempotent: unchanged entries are not written. A yaml channel that
    left the file is deleted; runtime channels are never deleted here, but a
    yaml entry with the name of a runtime channel takes it over."""
    block = config.get("channels") or {}
    if not isinstance(block, dict):
        raise Invalid("`channels:` must be a mapping of name -> channel", code="config_invalid")
    wanted = {str(name): channel_fields_from_yaml(name, raw) for name, raw in block.items()}
    # The shared tenant's yaml rows and namesakes, locked: two booting processes serialise here.
    mine = Q(source=DefSource.YAML) | Q(name__in=list(wanted))
    existing = {c.name: c for c in ChannelDef.objects.select_for_update().filter(mine, tenant_id="")}
    created, updated = [], []
    for name, fields in wanted.items():
        row = existing.get(name)
        if row is None:
            ChannelDef.objects.create(tenant_id="", name=name, source=DefSource.YAML, **fields)
            created.append(name)
        elif row.source != DefSource.YAML or any(getattr(row, k) != v for k, v in fields.items()):
            if row.source != DefSource.YAML:
                log.warning("channels.%s: the yaml entry takes over a runtime channel of that name", name)
            ChannelDef.objects.filter(pk=row.pk).update(source=DefSource.YAML, updated_at=timezone.now(), **fields)
            updated.append(name)
    gone = sorted(n for n, c in existing.items() if c.source == DefSource.YAML and n not in wanted)
    ChannelDef.objects.filter(tenant_id="", source=DefSource.YAML, name__in=gone).delete()
    if created or updated or gone:
        log.info("channels from yaml: created %s, updated %s, deleted %s", created, updated, gone)
    return ChannelSync(created=created, updated=updated, deleted=gone)
