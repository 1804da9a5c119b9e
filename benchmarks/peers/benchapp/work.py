"""The one job body every peer runs, and the ledger it reports to.

A job notes when it started (``time.time()``, the same clock as the driver's, which runs on
the same machine) in a Redis list: the driver counts the list for throughput and reads the
times for pickup latency. Redis is outside the database under test, and costs every peer
the same round trip.
"""

from __future__ import annotations

import os
import threading
import time

from django.db.models import F

from benchmarks.peers.benchapp.models import ROWS, Counter, ProbeRow

#: Redis lists: jobs of the drain workloads, and the latency probes.
DRAIN_KEY = "peers:drain"
PROBE_KEY = "peers:probe"

_local = threading.local()


def ledger():
    """A Redis client for this thread (and process: prefork children get their own)."""
    client = getattr(_local, "client", None)
    if client is None or getattr(_local, "pid", None) != os.getpid():
        import redis

        from benchmarks.peers.settings import REDIS_URL

        # No socket timeout: the driver's BLPOP waits up to a minute (redis-py's default
        # would cut it at 5 s).
        client = redis.Redis.from_url(REDIS_URL, db=2, socket_timeout=None)
        _local.client, _local.pid = client, os.getpid()
    return client


def run(kind: str, number: int) -> None:
    """``noop``: nothing. ``write``: one UPDATE by primary key on the project's table, then
    5 ms of waiting (a call to another service). ``probe``: a latency probe that reports to
    Redis and never touches the database. ``row``: a latency probe that inserts one row
    (its number and start time) into the database through the ORM, in autocommit, and
    reports nothing else: the driver polls the table for it from its own process."""
    started = time.time()
    if kind == "row":
        ProbeRow.objects.create(number=number, started=started)
        return
    if kind == "write":
        Counter.objects.filter(pk=number % ROWS + 1).update(hits=F("hits") + 1)
        time.sleep(0.005)
    ledger().rpush(PROBE_KEY if kind == "probe" else DRAIN_KEY, f"{number} {started!r}")
