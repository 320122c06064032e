"""Where a static yaml volume may not point (apps.tools.volumes checks every bindable entry at
boot): the volumes root, which holds every tenant's dynamic and ephemeral volumes, and the
runtime's own places (the data directory's `pg/`, `redis/`, `secrets.json`; the checkout).
Both raise Invalid(config_invalid), which stops the boot."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from apps.core.errors import Invalid

# Entries of the data directory that the runtime itself keeps (embedded Postgres and Redis,
# instance secrets): a volume inside the data directory must be a folder of its own.
DATA_DIR_PRIVATE = frozenset({"pg", "redis", "secrets.json"})


def check_private(name: str, path: str) -> None:
    """Refuse a static volume that reaches the data directory's own entries (secrets.json, pg/,
    redis/) or the checkout (the code, .loomcycle.env): one that is or contains either, sits
    inside the checkout outside the data directory, or inside one of those entries."""
    real = Path(os.path.realpath(path))
    data = Path(os.path.realpath(settings.LOOMCYCLE.data_dir or settings.BASE_DIR / ".loomcycle"))
    checkout = Path(os.path.realpath(settings.BASE_DIR))
    for place, what in ((data, "the data directory (secrets.json, pg/, redis/)"), (checkout, "the checkout")):
        if real == place or real in place.parents:
            raise Invalid(f"volumes.{name}: path {path} contains {what}", code="config_invalid")
    inside_data = data in real.parents
    if inside_data and real.relative_to(data).parts[0] in DATA_DIR_PRIVATE:
        raise Invalid(
            f"volumes.{name}: path {path} is inside the runtime's own {data / real.relative_to(data).parts[0]}",
            code="config_invalid",
        )
    if checkout in real.parents and not inside_data:
        raise Invalid(f"volumes.{name}: path {path} is inside the checkout {checkout}", code="config_invalid")


def check_apart(name: str, path: str, real_root: Path) -> None:
    real = Path(os.path.realpath(path))
    if real == real_root or real_root in real.parents or real in real_root.parents:
        raise Invalid(
            f"volumes.{name}: path {path} overlaps the volumes root {real_root} "
            "(dynamic and ephemeral volumes of every tenant live there)",
            code="config_invalid",
        )
