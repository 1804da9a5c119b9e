"""``manage.py demo_superuser``: make sure the demo admin account exists (admin / admin)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

USERNAME = "admin"
PASSWORD = "admin"  # noqa: S105 - a local demo account, printed on purpose


class Command(BaseCommand):
    help = "Create or reset the demo superuser (username admin, password admin)."

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=USERNAME, defaults={"email": "admin@example.com"}
        )
        user.is_staff = True
        user.is_superuser = True
        user.is_active = True
        user.set_password(PASSWORD)
        user.save()
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo superuser {'created' if created else 'reset'}: "
                f"username {USERNAME!r}, password {PASSWORD!r}"
            )
        )
