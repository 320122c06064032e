from django.db import migrations, models


class Migration(migrations.Migration):
    """agent_id is unique per tenant, not globally (issue 16): a 409 must not
    reveal, and a create must not squat, another tenant's agent_id."""

    dependencies = [("runs", "0004_waiting_slot")]

    operations = [
        migrations.AlterField(model_name="run", name="agent_id", field=models.CharField(max_length=128)),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.UniqueConstraint(fields=("agent_id", "tenant_id"), name="run_tenant_agent_id"),
        ),
    ]
