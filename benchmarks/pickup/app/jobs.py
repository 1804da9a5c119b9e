"""The pickup benchmark's job: it sends its start time to the benchmark process."""

from __future__ import annotations

import os
import socket
import time

from django_gator import Queueable

QUEUE = "pickup"
_reply: socket.socket | None = None


def report(job_id: int | None, moment: float) -> None:
    """Send ``"<job id> <moment>"`` to GATOR_PICKUP_REPLY (host:port) over UDP."""
    global _reply
    if _reply is None:
        _reply = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    host, port = os.environ["GATOR_PICKUP_REPLY"].rsplit(":", 1)
    _reply.sendto(f"{job_id} {moment!r}".encode(), (host, int(port)))


class Stamp(Queueable):
    """Sends ``"<job id> <time.time() at start>"`` to GATOR_PICKUP_REPLY (host:port)."""

    name = "pickup.stamp"
    queue = QUEUE

    def handle(self) -> None:
        started = time.time()
        report(self.job_id, started)


#: The row-writing probe's table, made by the benchmark (not a model: no migration).
PROBE_TABLE = "pickup_probe"


class Touch(Queueable):
    """A job as users write them: it writes one row to the database (its id and the time
    its handle() began) through Django's connection, then sends ``"<job id> <time.time()
    once the row is committed>"`` to GATOR_PICKUP_REPLY, the moment another process could
    first read the row. A thread that has no open connection pays the connect here."""

    name = "pickup.touch"
    queue = QUEUE

    def handle(self) -> None:
        from django.db import connection

        started = time.time()
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {PROBE_TABLE} (job_id, started) VALUES (%s, %s)",
                [self.job_id, started],
            )
        written = time.time()
        report(self.job_id, written)


class Noop(Queueable):
    name = "pickup.noop"
    queue = QUEUE

    def handle(self) -> None:
        return None
