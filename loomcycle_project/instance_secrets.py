"""The instance's generated secrets: Django's SECRET_KEY and the operator-token
pepper, in `<data dir>/secrets.json` (mode 0600).

On the embedded default (no DATABASE_URL) the data directory is the whole
deployment, so `manage.py` generates the file once, before Django loads its
settings, when `DJANGO_SECRET_KEY` or `LOOMCYCLE_OPERATOR_TOKEN_PEPPER` is not
set. Every process of the instance (web, workers, beat, later `manage.py`
commands) then reads the same values: admin sessions survive several web
processes and restarts, and token hashes are peppered. A deployment on
external servers sets both variables itself (each machine would otherwise
generate its own); `manage.py doctor` says which source is in use.

A data directory that already holds a database but no secrets file predates
this file: its tokens were hashed without a pepper, so the pepper generated
for it is empty (the tokens keep working) and a warning says to set one and
rotate the tokens.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger("loomcycle.secrets")

FILE_NAME = "secrets.json"
LEGACY_PEPPER_WARNING = (
    "%s: this data directory's tokens were minted without a pepper, so none is generated for it; "
    "set LOOMCYCLE_OPERATOR_TOKEN_PEPPER and rotate the tokens to pepper their hashes"
)


def path(data_dir: Path) -> Path:
    return data_dir / FILE_NAME


def load(data_dir: Path) -> dict[str, str]:
    """The generated secrets, or {} when the file does not exist."""
    try:
        raw = path(data_dir).read_text()
    except FileNotFoundError:
        return {}
    data = json.loads(raw)
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ValueError(f"{path(data_dir)}: not a JSON object of strings")
    return data


def ensure(data_dir: Path) -> dict[str, str]:
    """Create the file once (atomically: concurrent callers all read one winner's values)."""
    existing = load(data_dir)
    if existing:
        return existing
    data_dir.mkdir(parents=True, exist_ok=True)
    legacy = (data_dir / "pg").exists()
    values = {
        "secret_key": secrets.token_urlsafe(50),
        "operator_token_pepper": "" if legacy else secrets.token_urlsafe(32),
    }
    tmp = data_dir / f".{FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(values, fh)
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(tmp, path(data_dir))  # fails if another process created the file first
    except FileExistsError:
        return load(data_dir)
    finally:
        tmp.unlink()
    if legacy:
        log.warning(LEGACY_PEPPER_WARNING, path(data_dir))
    return values
