"""The worker: a supervisor process with a fetcher thread, executor threads and a
heartbeat thread. See :class:`django_gator.worker.supervisor.WorkerProcess`."""

from django_gator.worker.supervisor import WorkerProcess

__all__ = ["WorkerProcess"]
