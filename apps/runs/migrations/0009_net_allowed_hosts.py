from django.db import migrations, models


class Migration(migrations.Migration):
    """The run's effective network hosts (issue 20: HTTP/WebFetch policy)."""

    dependencies = [("runs", "0008_secrets")]

    operations = [
        migrations.AddField(model_name="run", name="allowed_hosts", field=models.JSONField(default=list)),
    ]
