"""Encrypted jobs: the permission ``django_gator.view_encrypted``, which lets an admin user
see the decrypted data of jobs whose class has ``encrypted = True``. Model options only:
no table changes."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_gator", "0024_dedupe_expiry"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="job",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("retry_job", "Can retry dead and failed jobs"),
                    ("cancel_job", "Can cancel jobs that have not started"),
                    ("view_encrypted", "Can see the decrypted data of encrypted jobs"),
                ],
            },
        ),
    ]
