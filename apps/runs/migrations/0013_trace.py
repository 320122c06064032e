from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0012_signal_outbox"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="trace_context",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
    ]
