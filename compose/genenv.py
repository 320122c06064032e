"""`python3 compose/genenv.py [PATH]`: generate every secret compose/docker-compose.yml requires
into its .env (default: compose/.env beside this file), so `docker compose up` starts with no
password typed by hand. Standard library only: it runs before any virtualenv exists.

A name the file already sets is kept as it is (so a second run changes nothing, and a Postgres
volume initialised with the first password keeps working); missing ones are appended. The file is
created with mode 0600 and the values are never printed: read them from the file (the bearer for
the API is LOOMCYCLE_AUTH_TOKEN). Values are hex, so they need no quoting in a URL.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _hex() -> str:
    return secrets.token_hex(32)


def _flower_auth() -> str:
    return f"flower:{secrets.token_hex(16)}"


# Every variable the compose file requires (`${NAME:?...}`), and how its value is made.
GENERATED: dict[str, Callable[[], str]] = {
    "POSTGRES_PASSWORD": _hex,
    "REDIS_PASSWORD": _hex,
    "DJANGO_SECRET_KEY": _hex,
    "LOOMCYCLE_OPERATOR_TOKEN_PEPPER": _hex,
    "LOOMCYCLE_AUTH_TOKEN": _hex,
    "LOOMCYCLE_FLOWER_BASIC_AUTH": _flower_auth,
}
ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=")


def names_set(text: str) -> set[str]:
    return {m.group(1) for line in text.splitlines() if (m := ASSIGNMENT.match(line))}


def ensure(path: Path) -> list[str]:
    """Append the missing names to `path` (created 0600); return the names added."""
    existing = path.read_text() if path.exists() else ""
    missing = [name for name in GENERATED if name not in names_set(existing)]
    if not missing:
        return []
    lines = [f"{name}={GENERATED[name]()}" for name in missing]
    prefix = "" if not existing or existing.endswith("\n") else "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as out:
        out.write(prefix + "\n".join(lines) + "\n")
    return missing


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else HERE / ".env"
    added = ensure(path)
    print(f"{path}: {'added ' + ', '.join(added) if added else 'every required secret already set'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
