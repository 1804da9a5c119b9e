from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Written",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("job_id", models.BigIntegerField()),
                ("client_addr", models.GenericIPAddressField(null=True)),
                ("written_at", models.DateTimeField()),
            ],
        ),
    ]
