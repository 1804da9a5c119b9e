"""Rows and logged-in clients shared by the admin tests (tests/test_admin_*.py)."""

from __future__ import annotations

from django.contrib.auth.models import Permission, User
from django.test import Client

from django_gator.models import Job, JobState
from tests.conftest import dead_jobs_for_operators

#: Dead jobs from real failed runs (three failed logins, two Booms).
dead_jobs = dead_jobs_for_operators


def dead_job(**fields) -> Job:
    """One dead job row with HTML in its arguments and errors."""
    defaults = {
        "name": "tests.testapp.jobs.Boom",
        "args": ["<script>alert(1)</script>"],
        "state": JobState.DEAD,
        "attempts": 1,
        "last_error": "RuntimeError: <b>bold</b>",
        "errors": [
            {
                "attempt": 1,
                "at": "2026-01-01T00:00:00+00:00",
                "worker": "w1",
                "class": "RuntimeError",
                "message": "<b>bold</b>",
                "traceback": "Traceback ...\n<img src=x onerror=alert(1)>",
            }
        ],
    }
    defaults.update(fields)
    return Job.objects.create(**defaults)


def staff(*perms: str) -> User:
    """A staff user "op" who may view jobs, and has the permissions named ``perms``."""
    user = User.objects.create_user("op", password="pw", is_staff=True)
    for codename in ("view_job", *perms):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def operator(*perms: str, name: str = "op") -> Client:
    """A client logged in as a staff user who may view jobs and has ``perms``."""
    user = User.objects.create_user(name, password="pw", is_staff=True)
    for codename in ("view_job", *perms):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client
