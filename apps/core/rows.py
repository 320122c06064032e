"""Rows as JSON and back, for snapshots (apps.snapshots): every app dumps and
restores its own tables through these two functions, so a snapshot section
has one row format whichever app wrote it.

- `row_dump` renders a model instance's concrete fields by attname (`run_id`,
  not `run`): datetimes as ISO 8601 text, every other value as it is (JSON
  values, strings, numbers, lists). Callers convert what JSON cannot carry
  (a pgvector embedding) themselves.
- `rows_insert_or_ignore` writes rows with `INSERT ... ON CONFLICT DO NOTHING`
  and returns how many it wrote: a row that matches an existing one on any
  unique constraint (its primary key included) is a no-op, which is what makes
  a restore idempotent (`conflict_on` narrows it to one column: runs skip a
  known id only, and report any other clash). Auto-increment keys are never carried: the database
  numbers restored rows itself. It goes around `save()`, `auto_now` and signals on
  purpose: the row's own timestamps are what is restored. The caller is the
  module that owns the table (apps.runs.store for runs_* tables).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, models
from django.utils import timezone

from apps.core.errors import Invalid

BATCH = 500


def row_dump(obj: models.Model, *, exclude: Iterable[str] = ()) -> dict[str, Any]:
    """The instance's concrete fields by attname, JSON-ready (datetimes as ISO text)."""
    skip = set(exclude)
    out: dict[str, Any] = {}
    for field in obj._meta.concrete_fields:
        if field.attname in skip:
            continue
        value = getattr(obj, field.attname)
        out[field.attname] = value.isoformat() if isinstance(value, datetime) else value
    return out


def _column_value(field: models.Field[Any, Any], row: dict[str, Any]) -> Any:
    """The database value of one field of a snapshot row; a missing key takes the field's default."""
    if field.attname not in row:
        if isinstance(field, models.DateTimeField) and (field.auto_now or field.auto_now_add):
            return field.get_db_prep_save(timezone.now(), connection)
        if not field.has_default() and not field.null:
            raise Invalid(f"snapshot row lacks {field.attname!r}", code="snapshot_invalid")
        value = field.get_default()
    else:
        value = _typed(field, row[field.attname])
    if isinstance(field, models.DateTimeField) and isinstance(value, str):
        try:
            value = field.to_python(value)
        except ValidationError as exc:
            raise Invalid(f"{field.attname}: not a timestamp", code="snapshot_invalid") from exc
    return field.get_db_prep_save(value, connection)


# The JSON type a snapshot value must have, by field class (the first match wins;
# JSON, array and vector fields take what JSON gives and the database checks the rest).
_JSON_TYPES: tuple[tuple[type[models.Field[Any, Any]], tuple[type, ...]], ...] = (
    (models.BooleanField, (bool,)),
    (models.FloatField, (int, float)),
    (models.IntegerField, (int,)),  # also the Big/Positive/Small variants and foreign keys to them
    (models.DateTimeField, (str,)),
    (models.CharField, (str,)),
    (models.TextField, (str,)),
)


def _typed(field: models.Field[Any, Any], value: Any) -> Any:
    """`value`, once it has the JSON type `field` stores (a dict where text belongs is refused,
    not stringified by the driver) and, for a field with choices, is one of them."""
    if value is None:
        if not field.null:
            raise Invalid(f"{field.attname} may not be null", code="snapshot_invalid")
        return None
    target = field.target_field if isinstance(field, models.ForeignKey) else field
    for kind, allowed in _JSON_TYPES:
        if isinstance(target, kind):
            if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
                raise Invalid(
                    f"{field.attname}: {type(value).__name__} where {kind.__name__} belongs", code="snapshot_invalid"
                )
            break
    if field.choices and value not in {key for key, _label in field.flatchoices}:
        raise Invalid(f"{field.attname}: {value!r} is not one of its choices", code="snapshot_invalid")
    return value


def _fields(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    """The columns a snapshot row carries: every concrete field but an auto-increment
    key, which is local to the instance that made it (the database numbers it here)."""
    auto = model._meta.auto_field
    return [f for f in model._meta.concrete_fields if f is not auto]


def _check_keys(model: type[models.Model], rows: Sequence[dict[str, Any]]) -> None:
    known = {f.attname for f in _fields(model)}
    for row in rows:
        if not isinstance(row, dict):
            raise Invalid(f"a {model._meta.label} row is not an object", code="snapshot_invalid")
        if unknown := set(row) - known:
            raise Invalid(
                f"{model._meta.label} row has unknown fields {sorted(unknown)}",
                code="snapshot_invalid",
                details={"model": model._meta.label, "fields": sorted(unknown)},
            )


def rows_insert_or_ignore(
    model: type[models.Model], rows: Sequence[dict[str, Any]], *, conflict_on: str | None = None
) -> int:
    """Insert `rows` (attname -> value, as `row_dump` gives them), skipping every
    row that conflicts with an existing one; the number of rows written. With
    `conflict_on` (a column), only a row matching on that column is skipped: a
    conflict on any other unique constraint raises IntegrityError for the caller
    to report."""
    _check_keys(model, rows)
    fields = _fields(model)
    columns = ", ".join(connection.ops.quote_name(str(f.column)) for f in fields)
    one = "(" + ", ".join(["%s"] * len(fields)) + ")"
    written = 0
    with connection.cursor() as cur:
        for start in range(0, len(rows), BATCH):
            chunk = rows[start : start + BATCH]
            params = [_column_value(f, row) for row in chunk for f in fields]
            values = ", ".join([one] * len(chunk))
            # ON CONFLICT DO NOTHING (no target): any unique constraint that matches makes the row a no-op.
            table = connection.ops.quote_name(model._meta.db_table)
            target = f" ({connection.ops.quote_name(conflict_on)})" if conflict_on else ""
            cur.execute(f"INSERT INTO {table} ({columns}) VALUES {values} ON CONFLICT{target} DO NOTHING", params)
            written += max(cur.rowcount, 0)
    return written
