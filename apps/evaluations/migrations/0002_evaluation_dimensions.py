# Per-axis scores (SPEC 6.6 `dimensions{axis->number}`). Adding a column with a default
# rewrites no row through UPDATE, so the immutability trigger of 0001 is not involved.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("evaluations", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="evaluation",
            name="dimensions",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
