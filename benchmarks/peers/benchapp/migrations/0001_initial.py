from django.db import migrations, models


def add_rows(apps, schema_editor):
    from benchmarks.peers.benchapp.models import ROWS

    Counter = apps.get_model("peers_bench", "Counter")
    Counter.objects.bulk_create(Counter(id=i, hits=0) for i in range(1, ROWS + 1))


class Migration(migrations.Migration):
    initial = True
    dependencies: list = []
    operations = [
        migrations.CreateModel(
            name="Counter",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("hits", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunPython(add_rows, migrations.RunPython.noop),
    ]
