"""Agents and skills as Markdown files (SPEC C.2 "Discovery", appendix D): every
`LOOMCYCLE_AGENTS_ROOT/<name>.md` and `LOOMCYCLE_SKILLS_ROOT/<name>/SKILL.md`,
read at boot and layered under the yaml's `agents:` / `skills:` blocks.

Layering follows loomcycle (internal/config `discoverAgents` / `mergeAgentDef`):
the file is the base, a yaml entry of the same name overrides it field by field
(a yaml `system_prompt` or `system_prompt_file` replaces the file's body). The
result is an ordinary yaml entry, so it is loaded as a static definition and
hashed exactly as one written in yaml. A bad file stops the boot with
config_invalid naming the file and line: the frontmatter's syntax, or the field
the definition's check refused when that field came from the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from apps.core.errors import Invalid
from apps.substrate.config import definition_from_markdown, frontmatter_key_lines
from apps.substrate.kinds import Refused, get_kind

_PROMPT_SOURCES = ("system_prompt", "system_prompt_file")


@dataclass(frozen=True)
class MarkdownDef:
    """One definition read from a Markdown file."""

    kind: str  # "agent" | "skill"
    name: str
    path: Path
    definition: dict[str, Any]
    key_lines: dict[str, int]


def _root(directory: str, variable: str) -> Path:
    root = Path(directory)
    if not root.is_dir():
        raise Invalid(f"{variable} is not a directory: {root}", code="config_not_found")
    return root


def agent_files(directory: str) -> list[Path]:
    """`<name>.md` directly in the agents root, sorted by name."""
    root = _root(directory, "LOOMCYCLE_AGENTS_ROOT")
    return sorted((p for p in root.iterdir() if p.suffix == ".md" and p.is_file()), key=lambda p: p.name)


def skill_files(directory: str) -> list[Path]:
    """`<name>/SKILL.md` one level under the skills root, sorted by name."""
    root = _root(directory, "LOOMCYCLE_SKILLS_ROOT")
    return sorted((d / "SKILL.md" for d in root.iterdir() if (d / "SKILL.md").is_file()), key=lambda p: str(p))


def _read(kind: str, path: Path) -> MarkdownDef:
    name, definition = definition_from_markdown(kind, path)
    return MarkdownDef(kind, name, path, definition, frontmatter_key_lines(path.read_text()))


def discover(*, agents_root: str, skills_root: str) -> list[MarkdownDef]:
    """Every Markdown definition under the roots (an empty root string: none)."""
    found = [_read("agent", p) for p in agent_files(agents_root)] if agents_root else []
    return found + ([_read("skill", p) for p in skill_files(skills_root)] if skills_root else [])


def configured() -> list[MarkdownDef]:
    """What the settings' roots hold (LOOMCYCLE_AGENTS_ROOT, LOOMCYCLE_SKILLS_ROOT)."""
    cfg = settings.LOOMCYCLE
    return discover(agents_root=cfg.agents_root, skills_root=cfg.skills_root)


def layer(base: dict[str, Any], override: Any) -> dict[str, Any]:
    """The file's fields, then the yaml entry's on top; a yaml prompt source replaces the body."""
    if not isinstance(override, dict):
        return dict(base)  # not a mapping: left for the yaml check to refuse
    out = dict(base)
    if any(key in override for key in _PROMPT_SOURCES):
        for key in _PROMPT_SOURCES:
            out.pop(key, None)
    return {**out, **override}


def with_markdown(config: dict[str, Any], found: list[MarkdownDef]) -> dict[str, Any]:
    """`config` with each file's definition layered under its yaml namesake; every
    layered entry is checked as its kind checks it, a refusal naming the file."""
    if not found:
        return config
    merged = dict(config)
    for md in found:
        key = get_kind(md.kind).yaml_key
        block = dict(merged.get(key) or {}) if isinstance(merged.get(key) or {}, dict) else {}
        yaml_entry = block.get(md.name, {})
        block[md.name] = layer(md.definition, yaml_entry)
        merged[key] = block
        _check(md, block[md.name], yaml_entry if isinstance(yaml_entry, dict) else {})
    return merged


def _check(md: MarkdownDef, entry: dict[str, Any], yaml_entry: dict[str, Any]) -> None:
    try:
        get_kind(md.kind).normalise(md.name, entry, False)
    except Refused as exc:
        field = _named_field(exc.message, md.key_lines)
        if field is not None and field in yaml_entry:
            return  # the yaml set it: the yaml check reports it, naming agents.<name>
        line = md.key_lines.get(field or "", 1)
        raise Invalid(f"{md.path}:{line}: {exc.message}", code="config_invalid") from exc


def _named_field(message: str, key_lines: dict[str, int]) -> str | None:
    """The frontmatter key a refusal names first (by its place in the message), if any."""
    hits = [(m.start(), key) for key in key_lines if (m := re.search(rf"\b{re.escape(key)}\b", message))]
    return min(hits)[1] if hits else None


def summary(found: list[MarkdownDef]) -> str:
    """One line for `doctor`: what was loaded, by kind."""
    agents = [md.name for md in found if md.kind == "agent"]
    skills = [md.name for md in found if md.kind == "skill"]
    return f"{len(agents)} agent(s) {agents}, {len(skills)} skill(s) {skills}"
