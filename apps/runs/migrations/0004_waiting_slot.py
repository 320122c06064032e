from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("runs", "0003_pending_calls")]

    operations = [
        # `waiting_slot`: a top-level run over `max_concurrent_runs`, not admitted yet.
        migrations.AlterField(
            model_name="run",
            name="status",
            field=models.CharField(
                choices=[
                    ("queued", "Queued"),
                    ("waiting_slot", "Waiting Slot"),
                    ("running", "Running"),
                    ("awaiting_input", "Awaiting Input"),
                    ("waiting_children", "Waiting Children"),
                    ("awaiting_interrupt", "Awaiting Interrupt"),
                    ("waiting_channel", "Waiting Channel"),
                    ("paused", "Paused"),
                    ("completed", "Completed"),
                    ("failed", "Failed"),
                    ("cancelled", "Cancelled"),
                ],
                default="queued",
                max_length=24,
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(
                    ("parent__isnull", True),
                    models.Q(("status__in", ["completed", "failed", "cancelled"]), _negated=True),
                ),
                fields=["status", "created_at"],
                name="run_top_live",
            ),
        ),
    ]
