"""The worker: a supervisor process with fetcher, executor, heartbeat, listener and
scheduler threads (see :mod:`django_gator.worker.supervisor` for the components).

Importing this package loads none of them: ``from django_gator.worker.supervisor import
WorkerProcess`` for the process, :mod:`django_gator.worker.inline` to run one job here.
"""
