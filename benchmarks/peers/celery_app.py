"""Celery with the Redis broker: the app its workers load (``celery -A``)."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.peers.settings")
os.environ["BENCH_PEER"] = "celery"

import django

django.setup()

from celery import Celery  # noqa: E402

from benchmarks.peers.benchapp import work  # noqa: E402
from benchmarks.peers.settings import REDIS_URL  # noqa: E402

app = Celery("peers", broker=f"{REDIS_URL}/1")
app.conf.update(
    # No result backend: none of the workloads reads a result, and a backend costs a write
    # per job.
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_default_queue="default",
)


@app.task(name="peers.work")
def celery_work(kind: str, number: int) -> None:
    work.run(kind, number)
