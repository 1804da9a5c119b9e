"""Fill the jobs table with a million rows and time the admin's hot pages on it.

    DJANGO_SETTINGS_MODULE=tests.settings GATOR_TEST_SUBPROCESS=1 \\
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gator_bench \\
    .venv/bin/python scripts/admin_timings.py --rows 1000000

The database named by DATABASE_URL must exist and be migrated (``manage.py migrate``); the
script deletes every job in it first. The rows are spread like a busy production table:
96 % succeeded over the last week, 2 % dead across a few job names and error classes, 1 %
failed (retrying), 1 % waiting, a few hundred running. Each page is fetched as a superuser
through Django's test client (no network), five times; the script prints the median and the
slowest time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("GATOR_TEST_SUBPROCESS", "1")

import django

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.models import Count  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from django.urls import reverse  # noqa: E402

from django_gator.models import Job  # noqa: E402
from tests.testapp.jobs import Boom, Echo, Noop, Record  # noqa: E402


def fill(rows: int) -> None:
    Job.objects.all().delete()
    batch = 20_000
    names = [Noop, Record, Echo, Boom]
    started = time.perf_counter()
    for start in range(0, rows, batch):
        job_class = names[(start // batch) % len(names)]
        count = min(batch, rows - start)
        job_class.dispatch_many([[i] for i in range(start, start + count)], queue="bulk")
    table = Job._meta.db_table
    ids = "id % 100"
    sql = [
        # 96 %: succeeded at some point in the last week.
        f"UPDATE {table} SET state = 'succeeded', attempts = 1, "
        "finished_at = next_execution_at - (id % 604800) * interval '1 second' "
        f"WHERE {ids} < 96",
        # 2 %: dead, grouped by name and one of four error classes.
        f"UPDATE {table} SET state = 'dead', attempts = 3, "
        "finished_at = next_execution_at - (id % 86400) * interval '1 second', "
        "error_class = (ARRAY['RuntimeError', 'ConnectionError', 'KeyError', "
        "'django_gator.exceptions.WorkerLost'])[1 + id % 4], "
        "last_error = (ARRAY['RuntimeError: disk full', 'ConnectionError: upstream timed out', "
        "'KeyError: ''customer''', 'django_gator.exceptions.WorkerLost: worker lost'])"
        f"[1 + id % 4] WHERE {ids} IN (96, 97)",
        # 1 %: failed, retrying in the next hour.
        f"UPDATE {table} SET state = 'failed', attempts = 1, error_class = 'ConnectionError', "
        "last_error = 'ConnectionError: upstream timed out', "
        "next_execution_at = next_execution_at + (id % 3600) * interval '1 second' "
        f"WHERE {ids} = 98",
        # A few hundred running.
        f"UPDATE {table} SET state = 'running', attempts = 1, reserved_by = 'bench:1:x', "
        f"locked_at = next_execution_at WHERE id % 2500 = 99",
        f"VACUUM ANALYZE {table}",
    ]
    if connection.vendor != "postgresql":
        raise SystemExit("the fill uses PostgreSQL SQL; point DATABASE_URL at PostgreSQL")
    with connection.cursor() as cursor:
        for statement in sql:
            cursor.execute(statement)
    print(f"filled {rows:,} rows in {time.perf_counter() - started:.0f} s")


def time_pages(repeat: int) -> None:
    setup_test_environment()
    user, _ = User.objects.get_or_create(username="timings", defaults={"is_staff": True})
    user.is_superuser = True
    user.is_staff = True
    user.save()
    client = Client()
    client.force_login(user)
    pages = {
        "job changelist": reverse("admin:django_gator_job_changelist"),
        "changelist, state=dead": reverse("admin:django_gator_job_changelist") + "?state=dead",
        "changelist, page 200": reverse("admin:django_gator_job_changelist") + "?p=200",
        "dead-job screen": reverse("admin:django_gator_job_dead"),
        "dashboard": reverse("admin:django_gator_job_dashboard"),
    }
    by_state = dict(Job.objects.order_by().values_list("state").annotate(n=Count("id")))
    print(f"rows by state: {by_state}")
    for label, url in pages.items():
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            response = client.get(url)
            times.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise SystemExit(f"{label}: HTTP {response.status_code}")
        print(
            f"  {label:<28} median {statistics.median(times) * 1000:7.0f} ms   "
            f"slowest {max(times) * 1000:7.0f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-fill", action="store_true", help="time the table as it is")
    options = parser.parse_args()
    if not options.no_fill:
        fill(options.rows)
    time_pages(options.repeat)


if __name__ == "__main__":
    main()
