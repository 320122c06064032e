"""`loomcycle.yaml` loading (SPEC C.1): layered files, later files win;
`${ENV}` / `${ENV:-fallback}` expansion for `[A-Za-z_][A-Za-z0-9_]*` names.

`runtime_config()` is this process's merged configuration, read once: the
gateway (providers, models, tiers, user_tiers, concurrency, memory.embedder)
and the substrate loader read their blocks from it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings

from apps.core.errors import Invalid

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _substitute(match: re.Match[str]) -> str:
    """`${VAR}` -> its value or ""; `${VAR:-fb}` -> fb when VAR is unset OR empty (shell semantics)."""
    value = os.environ.get(match.group(1), "")
    if match.group(2) is not None and value == "":
        return match.group(2)
    return value


def _expand(value: Any) -> Any:
    if isinstance(value, str):
        return _ENV_RE.sub(_substitute, value)
    if isinstance(value, list):
        return [_expand(v) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v) for k, v in value.items()}
    return value


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(paths: list[Path]) -> dict[str, Any]:
    """Read and merge the files in order (later wins); missing files are an error."""
    merged: dict[str, Any] = {}
    for path in paths:
        if not path.is_file():
            raise Invalid(f"config file not found: {path}", code="config_not_found")
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise Invalid(f"{path}: invalid yaml: {exc}", code="config_invalid") from exc
        if not isinstance(doc, dict):
            raise Invalid(f"{path}: top level must be a mapping", code="config_invalid")
        merged = _merge(merged, _expand(doc))
    return merged


def default_config_paths(base_dir: Path, configured: list[str]) -> list[Path]:
    if configured:
        return [Path(p) for p in configured]
    default = base_dir / "loomcycle.yaml"
    return [default] if default.is_file() else []


_LOADED: dict[tuple[str, ...], dict[str, Any]] = {}


def runtime_config(*, reload: bool = False) -> dict[str, Any]:
    """The configured files merged (empty when there are none), read once per
    process and set of files; `reload=True` (boot) reads them again."""
    files = tuple(settings.LOOMCYCLE.config_files)
    if reload or files not in _LOADED:
        paths = default_config_paths(settings.BASE_DIR, list(files))
        _LOADED[files] = load_config(paths) if paths else {}
    return _LOADED[files]
