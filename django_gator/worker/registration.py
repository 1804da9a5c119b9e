"""This worker's row in the workers' table: written at start-up once the tables are found,
written again when another worker declared this one lost, removed at the stop; and,
without LISTEN, the wakeup socket whose address the row publishes."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Sequence

from django.db import DatabaseError, connections

from django_gator import conf, schema, wakeup
from django_gator.engines import JobEngine, replication
from django_gator.exceptions import ReadOnlyDatabase, SchemaMissing
from django_gator.worker.listener import bind_wakeup_socket
from django_gator.worker.queues import QueueSpec
from django_gator.worker.retrier import Retrier

logger = logging.getLogger("django_gator.worker")

#: Seconds a stopping worker tries to remove its row while the database does not answer.
UNREGISTER_PATIENCE = 15.0


class Registration:
    """The row of worker ``worker_id`` (on ``hostname``, process ``pid``)."""

    def __init__(
        self,
        engine: JobEngine,
        alias: str,
        worker_id: str,
        *,
        specs: Sequence[QueueSpec],
        concurrency: int,
        supervisor: str,
        hostname: str,
        pid: int,
    ) -> None:
        self.engine = engine
        self.alias = alias
        self.worker_id = worker_id
        self.specs = specs
        self.concurrency = concurrency
        self.supervisor = supervisor
        self.hostname = hostname
        self.pid = pid
        self.wakeup_socket: socket.socket | None = None  # bound by bind_wakeups()
        self.wakeup_address: str | None = None

    def check_schema(self) -> bool:
        """True; raises SchemaMissing when django-gator's tables are not there, and
        ReadOnlyDatabase when the server refuses writes (a standby or replica: every claim
        would fail with "cannot execute UPDATE in a read-only transaction")."""
        missing = schema.missing_tables(self.alias)
        if missing:
            raise SchemaMissing(schema.missing_tables_message(self.alias, missing))
        reason = replication.read_only_reason(self.alias)
        if reason is not None:
            raise ReadOnlyDatabase(
                f"The job database {self.alias!r} does not take writes: {reason}. A worker "
                "claims and writes jobs: point its job database at the primary (a "
                "replica is for GATOR_READ_DATABASE)."
            )
        return True

    def bind_wakeups(self, burst: bool) -> bool:
        """Without LISTEN: bind a UDP socket that dispatch wakes this worker on
        (GATOR_WAKEUP_BIND), to publish in the row; whether one was bound."""
        bind = conf.wakeup_bind()
        if burst or bind is None or not wakeup.enabled(self.alias):
            return False
        bound = bind_wakeup_socket(*bind)
        if bound is None:
            return False
        self.wakeup_socket, self.wakeup_address = bound
        return True

    def register(self) -> bool:
        """Write the row (again, if it was there); True."""
        queues = json.dumps([[s.name, s.weight] for s in self.specs])
        self.engine.register_worker(
            self.worker_id,
            self.hostname,
            self.pid,
            queues,
            self.concurrency,
            supervisor=self.supervisor,
            wakeup_address=self.wakeup_address,
        )
        return True

    def unregister(self) -> None:
        """Remove the row, trying for up to UNREGISTER_PATIENCE seconds. The main
        thread's connection has been idle since the start, and a database restart or
        failover meanwhile broke it: it starts afresh. A row left behind stops
        heartbeating, so it counts as lost after GATOR_HEARTBEAT_TIMEOUT and is forgotten."""
        connections[self.alias].close()
        deadline = time.monotonic() + UNREGISTER_PATIENCE
        within = Retrier(self.alias, self.worker_id, lambda _: time.monotonic() > deadline)

        def remove() -> bool:
            self.engine.unregister_worker(self.worker_id)
            return True

        try:
            removed = within("remove the worker row", remove)
        except DatabaseError:
            removed = None
            logger.exception("Could not remove the worker row id=%s", self.worker_id)
        if removed is None:
            logger.error(
                "Worker row left behind id=%s: it counts as lost once its heartbeat is %gs old",
                self.worker_id,
                conf.heartbeat_timeout(),
            )
