"""Flow control: the concurrency key of jobs of limited classes, queue limits (concurrency,
rate) with who set them, the ledger of rate-limited starts, and the indexes of the limited
claim (the ordinary ready index no longer holds jobs with a concurrency key)."""

from django.db import migrations, models

from django_gator.engines import schema


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [
        ("django_gator", "0012_batches"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(
                blank=True,
                help_text="Set on jobs of a class with concurrency_limit or rate_limit: the "
                "key they are counted under (empty: the class as a whole).",
                max_length=200,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="concurrency",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="At most this many of its jobs run at once, across every worker "
                "(empty: no limit).",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_limit",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text='At most this many of its jobs start in any window: "10/s", '
                '"100/m", "1000/h" (empty: no limit).',
                max_length=20,
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="limits_by",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                help_text="Who set the limits in the admin (empty: they come from GATOR_QUEUES).",
                max_length=150,
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="limits_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="FlowStart",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("scope", models.CharField(max_length=500)),
                ("started_at", models.DateTimeField()),
            ],
            options={
                "db_table": "django_gator_flow_start",
                "indexes": [
                    models.Index(fields=["scope", "started_at"], name="gator_flow_start_scope")
                ],
            },
        ),
        migrations.RunPython(schema.create_flow, schema.drop_flow),
    ]
