"""Worker rows name the `gator_worker --processes` supervisor that started them."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_gator", "0009_workflows"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="supervisor",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="Id (host:pid:token) of the `gator_worker --processes` supervisor that started this worker; empty for a worker started on its own.",
                max_length=255,
            ),
        ),
    ]
