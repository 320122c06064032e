"""At most one live (retired_at IS NULL) operator token per name.

The token services already serialise writes with an advisory lock; this
partial unique index is the database's own guarantee. It is raw SQL so the
model state (owned by models.py) is unchanged.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("substrate", "0002_substrate_kinds_tokens")]

    operations = [
        migrations.RunSQL(
            sql=(
                "CREATE UNIQUE INDEX IF NOT EXISTS substrate_optoken_one_live_per_name "
                "ON substrate_operatortokendef (name) WHERE retired_at IS NULL"
            ),
            reverse_sql="DROP INDEX IF EXISTS substrate_optoken_one_live_per_name",
        ),
    ]
