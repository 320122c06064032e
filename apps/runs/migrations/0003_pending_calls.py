from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("runs", "0002_run_routing")]

    operations = [
        # Every parked tool call (sub-agents and channel waits), not only children.
        migrations.RenameField(model_name="run", old_name="pending_children", new_name="pending_calls"),
    ]
