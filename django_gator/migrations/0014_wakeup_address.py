"""Workers publish where a dispatch can wake them (a UDP address), for the databases without
LISTEN/NOTIFY (SQLite, MariaDB/MySQL)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_gator", "0013_flow_control"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="wakeup_address",
            field=models.CharField(
                blank=True,
                help_text="host:port of the UDP socket a dispatch wakes this worker on; "
                "empty when it has none (GATOR_WAKEUP_BIND = None, or PostgreSQL's LISTEN).",
                max_length=300,
                null=True,
            ),
        ),
    ]
