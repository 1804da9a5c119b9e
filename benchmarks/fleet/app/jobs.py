"""The fleet benchmark's jobs (queue ``fleet``).

``fleet.write`` is the realistic one and the default: it inserts one row (its job id, the
server session's client address, the server's time), committed on its own, so each job
costs the database what a typical job's own write costs besides the queue's claim and mark
(a row, its index entry, WAL and a commit). ``fleet.noop`` does nothing: the queue's own
cost alone.
"""

from __future__ import annotations

from django.db import connection

from django_gator import Queueable

QUEUE = "fleet"


class FleetWrite(Queueable):
    name = "fleet.write"
    queue = QUEUE

    def handle(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO gator_fleet_written (job_id, client_addr, written_at) "
                "VALUES (%s, inet_client_addr(), statement_timestamp())",
                [self.job_id],
            )


class FleetNoop(Queueable):
    name = "fleet.noop"
    queue = QUEUE

    def handle(self) -> None:
        return None


JOBS = {"write": FleetWrite, "noop": FleetNoop}
