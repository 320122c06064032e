"""`loomcycle.yaml` loading (SPEC C.1): layered files, later files win
(apps.core.config_layers: mappings merge, anything else is replaced);
`${ENV}` / `${ENV:-fallback}` expansion for `[A-Za-z_][A-Za-z0-9_]*` names.

Which layers: the embedded units LOOMCYCLE_PRESETS selects (apps.core.presets),
then every `*.yaml` / `*.yml` directly in LOOMCYCLE_CONFIG_DIR (sorted by name),
then LOOMCYCLE_CONFIG_FILES in order; `<repo>/loomcycle.yaml` only when neither
of the last two names a file. Each replaced value is logged once per load (INFO,
logger `loomcycle.config`, key and files only: values may be secrets); with
LOOMCYCLE_CONFIG_STRICT any replacement is a `config_conflict` error instead.

Secret-bearing fields (`mcp_servers.*.headers` and `.env`) are not expanded:
they keep the reference, resolved only where it is used (apps.core.secrets).
A reference to one of the runtime's own secrets, anywhere, is a config error.

`runtime_config()` is this process's merged configuration, read once: the
gateway (providers, models, tiers, user_tiers, concurrency, memory.embedder)
and the substrate loader read their blocks from it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings

from apps.core.config_layers import Layered, Replacement, TaggedSeq, untag
from apps.core.errors import Invalid
from apps.core.presets import Unit, units_resolve
from apps.core.secrets import config_secret_names, name_refusal, referenced_names, resolve_references

log = logging.getLogger("loomcycle.config")

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


class LayerLoader(yaml.SafeLoader):
    """The safe loader plus loomcycle's sequence tags `!prepend` / `!append` (config_layers)."""


def _tagged_sequence(loader: yaml.SafeLoader, node: yaml.Node) -> TaggedSeq:
    if not isinstance(node, yaml.SequenceNode):
        raise yaml.constructor.ConstructorError(
            None, None, f"{node.tag} tags a sequence, not a {getattr(node, 'id', 'value')}", node.start_mark
        )
    return TaggedSeq(loader.construct_sequence(node, deep=True), node.tag)


for _tag in ("!prepend", "!append"):
    LayerLoader.add_constructor(_tag, _tagged_sequence)


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise Invalid(f"config file not found: {path}", code="config_not_found")
    return _parse(path.read_text(), str(path))


def _parse(text: str, label: str) -> dict[str, Any]:
    try:
        doc = yaml.load(text, Loader=LayerLoader) or {}  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        raise Invalid(f"{label}: invalid yaml: {yaml_problem(exc)}", code="config_invalid") from exc
    if not isinstance(doc, dict):
        raise Invalid(f"{label}: top level must be a mapping", code="config_invalid")
    return doc


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong and where, without the offending line: PyYAML quotes it,
    and a config line may hold a secret."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{exc.problem or exc.context or 'syntax error'}{where}"
    return type(exc).__name__


def _refuse_conflicts(replaced: list[Replacement]) -> None:
    lines = "; ".join(r.describe() for r in replaced)
    raise Invalid(
        f"LOOMCYCLE_CONFIG_STRICT is set and a later file changes {len(replaced)} value(s): {lines}",
        code="config_conflict",
        details={"conflicts": [{"key": r.key, "earlier": list(r.earlier), "later": r.later} for r in replaced]},
    )


def load_config(paths: list[Path], *, strict: bool = False, units: list[Unit] | None = None) -> dict[str, Any]:
    """Merge the embedded `units`, then the files, in order (later wins); missing files
    are an error. Every replaced value is logged, or with `strict` refused (`config_conflict`)."""
    layered = Layered()
    for unit in units or []:
        layered.fold(_parse(unit.text, unit.label), unit.label)
    for path in paths:
        layered.fold(_read(path), str(path))
    if strict and layered.replaced:
        _refuse_conflicts(layered.replaced)
    for r in layered.replaced:
        log.info("config layers: %s set in %s is replaced by %s", r.key, ", ".join(r.earlier), r.later)
    # Expanded once, after the merge: a key variable any layer names is denied in every layer.
    tree = untag(layered.tree)
    expanded: dict[str, Any] = _expand(tree, (), config_secret_names(tree))
    return expanded


def config_dir_files(directory: str) -> list[Path]:
    """The `*.yaml` / `*.yml` files directly in `directory`, sorted by name
    (subdirectories and other files are skipped); a missing directory is an error."""
    root = Path(directory)
    if not root.is_dir():
        raise Invalid(f"LOOMCYCLE_CONFIG_DIR is not a directory: {root}", code="config_not_found")
    found = [p for p in root.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()]
    return sorted(found, key=lambda p: p.name)


def default_config_paths(base_dir: Path, configured: list[str], config_dir: str = "") -> list[Path]:
    """The directory's files, then the configured ones; `<base_dir>/loomcycle.yaml`
    (when it exists) only if neither gives a file."""
    paths = [*(config_dir_files(config_dir) if config_dir else []), *(Path(p) for p in configured)]
    if paths:
        return paths
    default = base_dir / "loomcycle.yaml"
    return [default] if default.is_file() else []


_LOADED: dict[tuple[tuple[str, ...], tuple[str, ...], str, bool], dict[str, Any]] = {}


def configured_paths() -> list[Path]:
    """The files `settings.LOOMCYCLE` names, in layer order (see `default_config_paths`)."""
    cfg = settings.LOOMCYCLE
    return default_config_paths(settings.BASE_DIR, list(cfg.config_files), cfg.config_dir)


def configured_units() -> list[Unit]:
    """The embedded units `settings.LOOMCYCLE.presets` selects, in layer order."""
    return units_resolve(settings.LOOMCYCLE.presets)


def runtime_config(*, reload: bool = False) -> dict[str, Any]:
    """The selected units and configured files merged (empty when there are none),
    read once per process and setting (presets, files, dir, strict); `reload=True`
    (boot) reads them again. The directory is listed when read: a file added later
    needs a reload."""
    cfg = settings.LOOMCYCLE
    key = (tuple(cfg.presets), tuple(cfg.config_files), cfg.config_dir, cfg.config_strict)
    if reload or key not in _LOADED:
        paths, units = configured_paths(), configured_units()
        _LOADED[key] = load_config(paths, strict=cfg.config_strict, units=units) if paths or units else {}
    return _LOADED[key]
