"""``django_gator_finished_tally``: the jobs that ended, counted per minute and queue by the
workers (django_gator.tallies), which the dashboard's hour chart and the queue figures'
last-hour counts read instead of the jobs table's finished rows."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_gator", "0027_fairness"),
    ]

    operations = [
        migrations.CreateModel(
            name="FinishedTally",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "minute",
                    models.DateTimeField(help_text="The minute the attempts ended in (UTC)."),
                ),
                ("queue", models.CharField(max_length=100)),
                ("succeeded", models.PositiveIntegerField(default=0)),
                ("dead", models.PositiveIntegerField(default=0)),
            ],
            options={
                "db_table": "django_gator_finished_tally",
                "indexes": [models.Index(fields=["minute"], name="gator_tally_minute")],
            },
        ),
    ]
