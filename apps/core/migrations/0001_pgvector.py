# pgvector is part of the stack (DESIGN.md): memory search needs it. On an
# external database this needs the extension to be available (pgvector image,
# or CREATE rights on an installed extension).
from django.db import migrations
from pgvector.django import VectorExtension


class Migration(migrations.Migration):
    dependencies: list[tuple[str, str]] = []
    operations = [VectorExtension()]
