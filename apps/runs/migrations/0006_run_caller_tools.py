from django.db import migrations, models


class Migration(migrations.Migration):
    """The creating request's tool narrowing, kept so sub-agents inherit it (issue 16)."""

    dependencies = [("runs", "0005_agent_id_per_tenant")]

    operations = [
        migrations.AddField(model_name="run", name="caller_tools", field=models.JSONField(blank=True, null=True)),
    ]
