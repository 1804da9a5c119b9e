from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("peers_bench", "0001_initial")]
    operations = [
        migrations.CreateModel(
            name="ProbeRow",
            fields=[
                ("number", models.BigIntegerField(primary_key=True, serialize=False)),
                ("started", models.FloatField()),
            ],
        ),
    ]
