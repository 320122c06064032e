"""Tool-use hook registrations (SPEC 2.9, 9.3)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('triggers', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='HookRegistration',
            fields=[
                ('seq', models.BigAutoField(primary_key=True, serialize=False)),
                ('hook_id', models.CharField(max_length=32, unique=True)),
                ('tenant_id', models.CharField(blank=True, default='', max_length=128)),
                ('owner', models.CharField(max_length=128)),
                ('name', models.CharField(max_length=128)),
                ('phase', models.CharField(choices=[('pre', 'pre'), ('post', 'post')], max_length=8)),
                ('agents', models.JSONField(default=list)),
                ('tools', models.JSONField(default=list)),
                ('callback_url', models.TextField()),
                ('fail_mode', models.CharField(choices=[('open', 'open'), ('closed', 'closed')], default='open', max_length=8)),
                ('timeout_ms', models.IntegerField()),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'ordering': ['seq'],
                'constraints': [models.UniqueConstraint(fields=('tenant_id', 'owner', 'name'), name='hook_identity'), models.CheckConstraint(condition=models.Q(('timeout_ms__gte', 1), ('timeout_ms__lte', 60000)), name='hook_timeout')],
            },
        ),
    ]
