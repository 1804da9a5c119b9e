"""What differs between the peers: how a job is enqueued, how workers start, what is purged.

Each :class:`Peer` is used inside the driver process, after ``django.setup()`` with
``BENCH_PEER`` naming it. The worker settings are each peer's documented recommendation for
the workload (noted on each), for one worker process and for two.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection

#: Threads (or async slots) per worker process, for the peers that have them.
THREADS = 16
#: The queue every drain job goes to, and the one the latency probes use while a backlog
#: drains (workload e).
QUEUE, FAST = "default", "fast"
PY = sys.executable


def _django(*args: str) -> list[str]:
    return [PY, "-m", "django", *args]


@dataclass(frozen=True)
class Peer:
    name: str  # as shown in the table
    app: str  # BENCH_PEER
    #: Whether a worker can serve two queues (workload e).
    has_queues: bool = True
    #: Whether there is one call that enqueues many jobs.
    has_bulk: bool = False
    note: str = ""

    def worker_commands(self, processes: int) -> list[list[str]]:
        """One command per OS process to start (a peer with its own supervisor: one)."""
        raise NotImplementedError

    def enqueue(self, kind: str, number: int, queue: str = QUEUE) -> None:
        raise NotImplementedError

    def enqueue_many(self, kind: str, numbers: Sequence[int], queue: str = QUEUE) -> None:
        for number in numbers:
            self.enqueue(kind, number, queue)

    def purge(self) -> None:
        """Remove every job, finished or not (between workloads)."""
        raise NotImplementedError

    def _truncate(self, *tables: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")


class Gator(Peer):
    def worker_commands(self, processes: int) -> list[list[str]]:
        # -q twice: both queues at the same weight (as a team would start it).
        command = _django("gator_worker", "-q", QUEUE, "-q", FAST, "--concurrency", str(THREADS))
        return [command] * processes

    def enqueue(self, kind: str, number: int, queue: str = QUEUE) -> None:
        from benchmarks.peers.benchapp.jobs import gator_work

        gator_work.dispatch(kind, number, queue=queue)

    def enqueue_many(self, kind: str, numbers: Sequence[int], queue: str = QUEUE) -> None:
        from benchmarks.peers.benchapp.jobs import gator_work

        gator_work.dispatch_many([(kind, n) for n in numbers], queue=queue)

    def purge(self) -> None:
        self._truncate("django_gator_job")


class CeleryThreads(Peer):
    pool = "threads"

    def worker_commands(self, processes: int) -> list[list[str]]:
        # Mingle, gossip and heartbeats off: the documented way to start faster and spare
        # the broker's chatter; results are ignored (celery_app.py).
        return [
            [
                PY, "-m", "celery", "-A", "benchmarks.peers.celery_app", "worker",
                "-P", "threads", "-c", str(THREADS), "-Q", f"{QUEUE},{FAST}",
                "-n", f"peers{i}@%h", "--without-mingle", "--without-gossip",
                "--without-heartbeat", "-l", "WARNING",
            ]
            for i in range(processes)
        ]  # fmt: skip

    def enqueue(self, kind: str, number: int, queue: str = QUEUE) -> None:
        from benchmarks.peers.celery_app import celery_work

        celery_work.apply_async((kind, number), queue=queue)

    def purge(self) -> None:
        from benchmarks.peers.benchapp.work import ledger

        ledger().connection_pool.get_connection("PING")  # Redis is up
        import redis

        from benchmarks.peers.settings import REDIS_URL

        redis.Redis.from_url(REDIS_URL, db=1).flushdb()


class CeleryPrefork(CeleryThreads):
    def worker_commands(self, processes: int) -> list[list[str]]:
        # One worker with `processes` forked children: Celery's default pool, which its docs
        # size to the number of cores.
        return [
            [
                PY, "-m", "celery", "-A", "benchmarks.peers.celery_app", "worker",
                "-P", "prefork", "-c", str(processes), "-Q", f"{QUEUE},{FAST}",
                "-n", "peers@%h", "--without-mingle", "--without-gossip",
                "--without-heartbeat", "-l", "WARNING",
            ]
        ]  # fmt: skip


class Procrastinate(Peer):
    def worker_commands(self, processes: int) -> list[list[str]]:
        # An asyncio worker; sync tasks run in its thread pool, `--concurrency` at a time.
        command = _django(
            "procrastinate", "worker", "-q", f"{QUEUE},{FAST}", "--concurrency", str(THREADS)
        )
        return [command] * processes

    def _task(self, queue: str):
        from benchmarks.peers.benchapp.tasks import procrastinate_work

        return procrastinate_work.configure(queue=queue)

    def enqueue(self, kind: str, number: int, queue: str = QUEUE) -> None:
        self._task(queue).defer(kind=kind, number=number)

    def enqueue_many(self, kind: str, numbers: Sequence[int], queue: str = QUEUE) -> None:
        self._task(queue).batch_defer(*({"kind": kind, "number": n} for n in numbers))

    def purge(self) -> None:
        self._truncate("procrastinate_jobs")


class DjangoQ(Peer):
    def worker_commands(self, processes: int) -> list[list[str]]:
        # One cluster; its worker processes come from Q_CLUSTER["workers"] (the driver sets
        # BENCH_PROCESSES for it).
        return [_django("qcluster")]

    def enqueue(self, kind: str, number: int, queue: str = QUEUE) -> None:
        from django_q.tasks import async_task

        async_task("benchmarks.peers.benchapp.work.run", kind, number)

    def purge(self) -> None:
        self._truncate("django_q_ormq", "django_q_task")


class TasksDB(Peer):
    def worker_commands(self, processes: int) -> list[list[str]]:
        # db_worker runs one task at a time per process. Polled every 0.1 s rather than the
        # default 1 s: what a team that cares about latency would set.
        command = _django(
            "db_worker", "--queue-name", f"{QUEUE},{FAST}", "--interval", "0.1",
            "--no-startup-delay", "--no-reload",
        )  # fmt: skip
        return [command] * processes

    def enqueue(self, kind: str, number: int, queue: str = QUEUE) -> None:
        from benchmarks.peers.benchapp.tasks import tasksdb_work

        tasksdb_work.using(queue_name=queue).enqueue(kind, number)

    def purge(self) -> None:
        self._truncate("django_tasks_database_dbtaskresult")


PEERS: dict[str, Peer] = {
    peer.name: peer
    for peer in (
        Gator("django-gator", "gator", has_bulk=True),
        CeleryThreads("celery-threads", "celery", note="Redis broker, threads pool"),
        CeleryPrefork("celery-prefork", "celery", note="Redis broker, prefork pool"),
        Procrastinate("procrastinate", "procrastinate", has_bulk=True),
        DjangoQ("django-q2", "djangoq", has_queues=False, note="ORM broker; one queue per cluster"),
        TasksDB("django-tasks-db", "tasksdb", note="one task at a time per process"),
    )
}
