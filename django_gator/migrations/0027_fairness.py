"""Weighted fair share: ``fairness_key`` and ``fair_order`` on jobs (NULL-able, no default:
no table rewrite, no SQLite rebuild), the fair claim's index (built to suit each database,
see django_gator.engines.schema_fairness) and the per-key counters of
``django_gator_fair_share``."""

from django.db import migrations, models

from django_gator.engines import schema_fairness


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [
        ("django_gator", "0026_awaited"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="fairness_key",
            field=models.CharField(
                blank=True,
                help_text="Set on jobs of a fair queue (GATOR_FAIRNESS): the tenant their "
                "claims are shared between (empty: the queue's keyless tenant).",
                max_length=200,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="fair_order",
            field=models.FloatField(
                blank=True,
                editable=False,
                help_text="A fair queue's stamp: its claims take jobs by priority, then this.",
                null=True,
            ),
        ),
        migrations.CreateModel(
            name="FairShare",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=100)),
                ("fairness_key", models.CharField(blank=True, max_length=200)),
                ("last_stamp", models.FloatField()),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "db_table": "django_gator_fair_share",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("queue", "fairness_key"), name="gator_fair_share_key"
                    )
                ],
            },
        ),
        migrations.RunPython(schema_fairness.create_fair, schema_fairness.drop_fair),
    ]
