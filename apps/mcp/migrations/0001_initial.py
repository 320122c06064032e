"""The app's first migration: empty, so that each capability adds its own tables after it."""

from django.db import migrations


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations: list[migrations.operations.base.Operation] = []
