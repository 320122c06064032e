"""`loomcycle.yaml` loading (SPEC C.1): layered files, later files win;
`${ENV}` / `${ENV:-fallback}` expansion for `[A-Za-z_][A-Za-z0-9_]*` names.

Secret-bearing fields (`mcp_servers.*.headers` and `.env`) are not expanded:
they keep the reference, resolved only where it is used (apps.core.secrets).
A reference to one of the runtime's own secrets, anywhere, is a config error.

`runtime_config()` is this process's merged configuration, read once: the
gateway (providers, models, tiers, user_tiers, concurrency, memory.embedder)
and the substrate loader read their blocks from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from django.conf import settings

from apps.core.errors import Invalid
from apps.core.secrets import config_secret_names, name_refusal, referenced_names, resolve_references

# (top-level block, field of each entry) whose string values stay references.
SECRET_FIELDS = frozenset({("mcp_servers", "headers"), ("mcp_servers", "env")})


def _expand(value: Any, path: tuple[str, ...], denied: set[str]) -> Any:
    """`${VAR}` -> its value or ""; `${VAR:-fb}` -> fb when VAR is unset OR empty (shell semantics)."""
    if isinstance(value, str):
        try:
            if len(path) >= 3 and (path[0], path[2]) in SECRET_FIELDS:
                _check_references(value, denied)
                return value
            return resolve_references(value, runtime=False, denied=denied)
        except ValueError as exc:
            raise Invalid(f"{'.'.join(path)}: {exc}", code="config_invalid") from exc
    if isinstance(value, list):
        return [_expand(v, path, denied) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, (*path, str(k)), denied) for k, v in value.items()}
    return value


def _check_references(text: str, denied: set[str]) -> None:
    for name in referenced_names(text):
        refusal = name_refusal(name, runtime=False, denied=denied)
        if refusal:
            raise ValueError(refusal)


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
        merged = _merge(merged, doc)
    # Expanded once, after the merge: a key variable any layer names is denied in every layer.
    expanded: dict[str, Any] = _expand(merged, (), config_secret_names(merged))
    return expanded


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
