"""The MCP client's tool cache (apps.mcp.models.DiscoveredTools)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("mcp", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="DiscoveredTools",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("def_id", models.CharField(max_length=40, unique=True)),
                ("tenant_id", models.CharField(blank=True, db_index=True, default="", max_length=128)),
                ("server", models.CharField(max_length=128)),
                ("tools", models.JSONField(default=list)),
                ("error", models.TextField(blank=True, default="")),
                ("discovered_at", models.DateTimeField()),
            ],
            options={"verbose_name": "discovered MCP tools", "verbose_name_plural": "discovered MCP tools"},
        ),
    ]
