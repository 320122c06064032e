"""The instance's generated secrets: Django's SECRET_KEY, the operator-token
pepper and the embedded Postgres's password, in `<data dir>/secrets.json` (mode 0600).

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

import fcntl
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
    """Every generated value of the embedded default (SECRET_KEY, the pepper, the embedded
    Postgres's password), each made once: concurrent callers all read one winner's values."""
    return _with_values(data_dir, ("secret_key", "operator_token_pepper", "postgres_password"))


def postgres_password(data_dir: Path) -> str:
    """The embedded Postgres's password (loomcycle_project.embedded), made once."""
    return _with_values(data_dir, ("postgres_password",))["postgres_password"]


def _with_values(data_dir: Path, names: tuple[str, ...]) -> dict[str, str]:
    existing = load(data_dir)
    if all(name in existing for name in names):
        return existing
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # writers take turns; a reader sees the old or the new file whole
        current = load(data_dir)
        missing = [name for name in names if name not in current]
        if not missing:
            return current
        legacy = "operator_token_pepper" in missing and (data_dir / "pg").exists()
        current |= {name: _generated(name, legacy=legacy) for name in missing}
        _write(data_dir, current)
    finally:
        os.close(lock)  # releases the lock
    if legacy:
        log.warning(LEGACY_PEPPER_WARNING, path(data_dir))
    return current


def _generated(name: str, *, legacy: bool) -> str:
    if name == "operator_token_pepper":
        return "" if legacy else secrets.token_urlsafe(32)
    return secrets.token_urlsafe(50 if name == "secret_key" else 32)


def _write(data_dir: Path, values: dict[str, str]) -> None:
    """The whole file, replaced atomically (0600 from its creation on)."""
    tmp = data_dir / f".{FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(values, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path(data_dir))
    finally:
        tmp.unlink(missing_ok=True)
