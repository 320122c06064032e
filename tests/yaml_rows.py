"""The `agents` fixture's yaml load, made cheap: the rows `load_yaml_config` writes into an
empty database are the same for every test of a session with the same yaml, so they are
loaded once per process and copied back after each flush.

`load_yaml_config` syncs ~50 definitions one by one (a lock, the pointer, the upsert, a
savepoint each: ~400 statements, 0.6-0.7 s on the shared 2-core host), and about half the
suite's tests start with it. The first load of a yaml config in a process runs the real
thing into the freshly flushed tables and copies every table it filled into an unlogged
template table (`_yamltpl_<table>`, outside Django's models, so flushes leave it alone).
Later loads insert the template's rows back in one transaction, with every timestamp moved
forward by the time since the capture (schedules reckon their first slot from
`promoted_at`/`created_at`, so the rows must look just written).

It falls back to the real load, never to a guess: when the yaml differs (keyed by its
content), when a table it fills already had rows before the capture (another fixture wrote
first), or when the copy hits a conflict (a fixture's row with the same key). Row ids are the
capture's, and sequences are never rewound (DELETE leaves them past the captured ids). A
cache keyed by def id in this process is emptied at each load (a test may have edited a row
in place); the workers' caches hold the template's own content.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import DatabaseError, connection, transaction
from django.db.backends.utils import CursorWrapper

from apps.core.config import runtime_config
from apps.substrate import selectors
from loomcycle_project.bootstrap import load_yaml_config

log = logging.getLogger("tests.yaml_rows")


@dataclass(frozen=True)
class Template:
    tables: tuple[str, ...]
    inserts: tuple[str, ...]  # one INSERT ... SELECT per table, timestamps shifted by %(shift_from)s
    made_at: datetime


_TEMPLATES: dict[str, Template] = {}  # yaml content key -> its template


def yaml_rows_load() -> None:
    """What `load_yaml_config()` would write into the flushed database, from the template when there is one."""
    _forget_cached_definitions()
    key = _key()
    template = _TEMPLATES.get(key)
    if template is not None and _restore(template):
        return
    if template is not None:  # the copy conflicted: the real load
        load_yaml_config()
        return
    captured = _capture(len(_TEMPLATES))
    if captured is not None:  # else a filled table had rows already: captured by a later test
        _TEMPLATES[key] = captured


def _forget_cached_definitions() -> None:
    """This process's cache of definitions by id (apps.substrate.selectors.agent_definition) assumes a
    row is never edited. The template gives every test the same ids, and a test may edit a row in
    place (a malformed field no service would write): the next test must not read that copy."""
    with selectors._DEFINITIONS_LOCK:
        selectors._DEFINITIONS.clear()


def _key() -> str:
    config = runtime_config(reload=True)
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def _tables() -> list[str]:
    return sorted(connection.introspection.django_table_names(only_existing=True, include_views=False))


def _counts(tables: list[str]) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(f"SELECT {i}, count(*) FROM {_q(t)}" for i, t in enumerate(tables)))
        return {tables[i]: n for i, n in cursor.fetchall()}


def _capture(index: int) -> Template | None:
    """Run the real load and copy the tables it filled; None when a filled table was not empty."""
    tables = _tables()
    before = _counts(tables)
    load_yaml_config()
    after = _counts(tables)
    filled = [t for t in tables if after[t] > before[t]]
    if any(before[t] for t in filled):
        return None
    inserts = []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (made_at,) = cursor.fetchone()
        for table in filled:
            copy = _q(f"_yamltpl{index}_{table}")
            cursor.execute(f"DROP TABLE IF EXISTS {copy}")
            cursor.execute(f"CREATE UNLOGGED TABLE {copy} AS SELECT * FROM {_q(table)}")
            inserts.append(_insert(cursor, table, copy))
    return Template(tables=tuple(filled), inserts=tuple(inserts), made_at=made_at)


def _insert(cursor: CursorWrapper, table: str, copy: str) -> str:
    """INSERT INTO table (...) SELECT ... FROM copy, each timestamptz column moved forward."""
    cursor.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        [table],
    )
    columns = cursor.fetchall()
    names = ", ".join(_q(name) for name, _ in columns)
    values = ", ".join(
        f"{_q(name)} + (now() - %(shift_from)s)" if kind == "timestamp with time zone" else _q(name)
        for name, kind in columns
    )
    return f"INSERT INTO {_q(table)} ({names}) SELECT {values} FROM {copy}"


def _restore(template: Template) -> bool:
    """Copy the template's rows back in one transaction; False (nothing written) on a conflict."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            for statement in template.inserts:
                cursor.execute(statement, {"shift_from": template.made_at})
    except DatabaseError as exc:  # a fixture's row got there first: the caller does the real load
        log.info("yaml rows: template not usable here (%s); loading the yaml", exc)
        return False
    return True


def _q(name: str) -> str:
    return connection.ops.quote_name(name)
