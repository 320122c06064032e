"""The embedded Postgres asks every connection for the password kept in the data directory's
0600 secrets file (loomcycle_project.embedded): on its socket, a client without it (another
local user, a command that reached the socket) is refused; the DATABASE_URL the runtime built
carries it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from loomcycle_project import instance_secrets

pytestmark = pytest.mark.skipif(
    not os.environ.get("LOOMCYCLE_EMBEDDED_POSTGRES"), reason="the suite runs on a DATABASE_URL of its own"
)


def test_the_embedded_postgres_refuses_a_client_without_the_password() -> None:
    socket_dir = str(settings.DATABASES["default"]["OPTIONS"]["host"])
    data_dir = Path(os.environ["LOOMCYCLE_DATA_DIR"])
    password = instance_secrets.load(data_dir)["postgres_password"]
    assert stat.S_IMODE(instance_secrets.path(data_dir).stat().st_mode) == 0o600 and len(password) >= 32
    for who in ("postgres", f"postgres:{'x' * 32}"):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(f"postgresql://{who}@/postgres?host={socket_dir}", connect_timeout=5).close()
    with psycopg.connect(os.environ["DATABASE_URL"], connect_timeout=5) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    assert f":{password}@" in os.environ["DATABASE_URL"]
