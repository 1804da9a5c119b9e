"""The declared ``GATOR_*`` settings of the periodic work (cron schedules, pruning) and of
the metrics, the tail of the table in :mod:`django_gator.conf.table`."""

from __future__ import annotations

from django_gator.conf.rules import (
    CallablePath,
    Choice,
    Flag,
    Number,
    Setting,
    Table,
    Text,
)

DAY = 24 * 3600

PERIODIC: tuple[Setting, ...] = (
    Setting(
        "GATOR_SCHEDULES",
        {},
        Table('dict `{name: {"job": ..., "cron": ..., ...}}`'),
        'cron schedules declared in settings (see "Cron schedules")',
        checked_by="django_gator.E005",
    ),
    Setting(
        "GATOR_SCHEDULER",
        True,
        Flag(),
        "whether `gator_worker` runs the scheduler loop (safe on every worker)",
    ),
    Setting(
        "GATOR_SCHEDULER_INTERVAL",
        1.0,
        Number(0.001),
        "longest pause, in seconds, between two looks at the schedules",
    ),
    Setting(
        "GATOR_SCHEDULE_MISFIRE_GRACE",
        60.0,
        Number(0),
        "seconds after which an occurrence not yet dispatched counts as missed",
    ),
    Setting(
        "GATOR_SCHEDULE_RUN_RETENTION_DAYS",
        7,
        # The rows stop a second worker from dispatching the same occurrence: they must
        # outlive every worker's look at it.
        Number(1),
        "days `ScheduledRun` rows are kept",
    ),
    Setting(
        "GATOR_SCHEDULER_CLOCK",
        None,
        CallablePath(),
        "clock of the scheduler (tests); `None`: the database's time",
    ),
    Setting(
        "GATOR_PRUNE_SUCCEEDED_AFTER",
        7 * DAY,
        Number(0),
        "seconds after `finished_at` that `gator_prune` keeps succeeded jobs (7 days)",
    ),
    Setting(
        "GATOR_PRUNE_CANCELLED_AFTER",
        7 * DAY,
        Number(0),
        "seconds after `finished_at` that `gator_prune` keeps cancelled jobs (7 days)",
    ),
    Setting(
        "GATOR_PRUNE_DEAD_AFTER",
        30 * DAY,
        Number(0),
        "seconds after `finished_at` that `gator_prune --dead` keeps dead jobs (30 days)",
    ),
    Setting(
        "GATOR_AUTO_PRUNE",
        True,
        Flag(),
        "workers delete succeeded and cancelled jobs past their retention (one worker at a "
        "time); `False`: only `gator_prune` does",
    ),
    Setting(
        "GATOR_PRUNE_INTERVAL",
        300.0,
        Number(0.01),
        "seconds between two automatic pruning passes (each by one worker of the fleet)",
    ),
    Setting(
        "GATOR_PRUNE_BATCH_SIZE",
        1000,
        Number(1, whole=True),
        "rows an automatic pruning pass deletes per transaction",
    ),
    Setting(
        "GATOR_PRUNE_PAUSE",
        0.1,
        Number(0, 60),
        "seconds an automatic pruning pass waits between two batches",
    ),
    Setting(
        "GATOR_PARTITIONING",
        None,
        Choice(("day", "hour"), none="a plain table"),
        "PostgreSQL: finished jobs kept in partitions of a day or an hour that retention "
        "drops whole (see `gator_partitions`)",
    ),
    Setting(
        "GATOR_METRICS_PORT",
        None,
        Number(0, 65535, whole=True, none="no metrics endpoint"),
        "port of the worker's Prometheus `/metrics` endpoint (`gator_worker --metrics-port`; "
        "needs `django-gator[prometheus]`)",
    ),
    Setting(
        "GATOR_METRICS_CACHE",
        "default",
        Text("a key of `CACHES`"),
        "Django cache that keeps the queue figures of `django_gator.metrics.view` between "
        "database reads (share one between replicas)",
    ),
    Setting(
        "GATOR_METRICS_CACHE_SECONDS",
        15.0,
        Number(0),
        "seconds the queue figures of `django_gator.metrics.view` are served from the cache "
        "before one scrape reads them again (`0`: every scrape reads the database)",
    ),
)
