"""The pickup benchmark's job: it sends its start time to the benchmark process."""

from __future__ import annotations

import os
import socket
import time

from django_gator import Queueable

QUEUE = "pickup"
_reply: socket.socket | None = None


class Stamp(Queueable):
    """Sends ``"<job id> <time.time() at start>"`` to GATOR_PICKUP_REPLY (host:port)."""

    name = "pickup.stamp"
    queue = QUEUE

    def handle(self) -> None:
        started = time.time()
        global _reply
        if _reply is None:
            _reply = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        host, port = os.environ["GATOR_PICKUP_REPLY"].rsplit(":", 1)
        _reply.sendto(f"{self.job_id} {started!r}".encode(), (host, int(port)))


class Noop(Queueable):
    name = "pickup.noop"
    queue = QUEUE

    def handle(self) -> None:
        return None
