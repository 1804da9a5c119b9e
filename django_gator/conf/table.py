"""The declared table of the ``GATOR_*`` settings: name, default, allowed values, meaning.

The README's settings table is this table (tests/test_conf.py compares them); a new setting
is added here, with bad values in tests/test_conf.py's BAD and a row in the README."""

from __future__ import annotations

from django_gator.conf.rules import (
    CallablePath,
    Choice,
    Delays,
    Flag,
    HostPort,
    Names,
    Number,
    QueueTable,
    Setting,
    Table,
    Text,
)

DAY = 24 * 3600

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "GATOR_DATABASE",
        "default",
        Text("a key of `DATABASES`"),
        "database alias of the jobs table",
        checked_by="django_gator.E002",
    ),
    Setting(
        "GATOR_READ_DATABASE",
        None,
        Text("a key of `DATABASES`", none="every read on `GATOR_DATABASE`"),
        "database alias of a read replica of `GATOR_DATABASE` that the admin's job lists, "
        "counts and dashboard, the metrics' queue gauges and `gator_status` read from "
        '(writes never go there); see "Read replicas"',
        checked_by="django_gator.E007",
    ),
    Setting(
        "GATOR_READ_DATABASE_MAX_LAG",
        30.0,
        Number(0),
        "seconds the read replica may lag behind `GATOR_DATABASE`; past it (or when it does "
        "not answer) reads go to `GATOR_DATABASE`, and the admin says so",
    ),
    Setting(
        "GATOR_DISPATCH_ON_COMMIT",
        False,
        Flag(),
        "defer every dispatch's INSERT to `transaction.on_commit`",
    ),
    Setting(
        "GATOR_DISPATCH_ON_COMMIT_RETRY_DELAYS",
        [0.5, 1.0, 2.0],
        Delays(0, 300),
        "seconds before each new try of a deferred INSERT that failed (`[]`: one try); "
        "then the jobs are logged and `dispatch_failed` is sent",
    ),
    Setting(
        "GATOR_MAX_PAYLOAD_BYTES",
        1_048_576,
        Number(2, whole=True),
        "largest JSON payload (args + kwargs) accepted by dispatch, in bytes",
    ),
    Setting(
        "GATOR_MAX_RESULT_BYTES",
        1_048_576,
        Number(2, whole=True, none="no bound"),
        "largest JSON result a job may return, in bytes; a larger one fails its attempt "
        "(`ResultTooLarge`)",
    ),
    Setting(
        "GATOR_MAX_BATCH_SIZE",
        100_000,
        Number(1, whole=True),
        "most members one `Batch` accepts; a dispatch beyond it raises and inserts nothing",
    ),
    Setting(
        "GATOR_CONCURRENCY",
        4,
        Number(1, whole=True),
        "executor threads per worker process",
    ),
    Setting(
        "GATOR_PROCESSES",
        1,
        Number(1, whole=True),
        "worker processes one `gator_worker` runs (more than 1: a supervisor starts and "
        "watches them)",
    ),
    Setting(
        "GATOR_ASYNC_CONCURRENCY",
        100,
        Number(1, whole=True),
        "`async def` jobs run at once on each worker process's event loop",
    ),
    Setting(
        "GATOR_POLL_INTERVAL",
        1.0,
        # 0 would make an idle worker poll without pause (a busy loop).
        Number(0.001),
        "longest pause, in seconds, between looks for due jobs while idle",
    ),
    Setting(
        "GATOR_HEARTBEAT_INTERVAL",
        5.0,
        Number(0.01),
        "seconds between a worker's heartbeats",
    ),
    Setting(
        "GATOR_HEARTBEAT_TIMEOUT",
        30.0,
        Number(0.05),
        "heartbeat age, in seconds, after which a worker counts as lost (longer than "
        "`GATOR_HEARTBEAT_INTERVAL`)",
    ),
    Setting(
        "GATOR_MAX_RESCUES",
        3,
        Number(1, whole=True),
        "crashes of its worker while a job ran alone after which it is `dead` (poison pill)",
    ),
    Setting(
        "GATOR_OUTAGE_RETRIES",
        10,
        Number(0, whole=True),
        "attempts of a job cut short by a lost database connection (a restart, a failover, "
        "a killed connection) that are retried without charging its retry budget; after "
        "that its own policy applies",
    ),
    Setting(
        "GATOR_SHUTDOWN_TIMEOUT",
        30.0,
        Number(0),
        "seconds running jobs get after the first stop signal",
    ),
    Setting(
        "GATOR_MAX_HANDBACKS",
        3,
        Number(1, whole=True, none="never charged"),
        "hand-backs of a running job by stopping workers after which the attempt they cut "
        "is charged (every Nth one fails the attempt with `JobHandedBack`; the job's retry "
        'policy decides); see "Jobs that never end"',
    ),
    Setting(
        "GATOR_PROGRESS_INTERVAL",
        2.0,
        Number(0),
        "seconds between two writes of a running attempt's `progress()` and `checkpoint()` "
        '(the latest value is kept in memory meanwhile); see "Long-running jobs"',
    ),
    Setting(
        "GATOR_DEFAULT_TIMEOUT",
        None,
        Number(0.001, none="no limit"),
        "seconds a run of a job class that sets no `timeout` may take (a class's own "
        "`timeout` wins)",
    ),
    Setting(
        "GATOR_LONG_RUNNING_AFTER",
        3600.0,
        Number(1),
        "seconds after which the admin's dashboard and job list flag a running job as long running",
    ),
    Setting(
        "GATOR_UNKNOWN_JOB_WINDOW",
        900.0,
        Number(0),
        "seconds a job whose name a worker does not know waits for one that does (a "
        "rolling deploy), before it goes `dead`",
    ),
    Setting(
        "GATOR_AUTODISCOVER",
        [],
        Names("module name"),
        "modules imported from every installed app besides `jobs` (and `tasks` with the "
        "Tasks backend) to register its jobs",
    ),
    Setting(
        "GATOR_ASYNC_COMMIT",
        True,
        Flag(),
        "PostgreSQL: worker bookkeeping writes use `synchronous_commit = off`",
    ),
    Setting(
        "GATOR_POOLED_DATABASES",
        [],
        Names("`DATABASES` key"),
        "aliases reached through a transaction-pooling proxy (PgBouncer "
        "`pool_mode = transaction`): no session settings, no server-side prepares, no LISTEN; "
        'see "PgBouncer"',
    ),
    Setting(
        "GATOR_LISTEN_DATABASE",
        None,
        Text("a key of `DATABASES`", none="`GATOR_DATABASE`"),
        "PostgreSQL: the alias of a direct (not pooled) connection the worker LISTENs on",
    ),
    Setting(
        "GATOR_WAKEUP_BIND",
        "127.0.0.1:0",
        HostPort("port 0 picks a free one"),
        "SQLite, MariaDB/MySQL: the UDP address a worker binds for wakeups from dispatch "
        '(`None`: no wakeups, idle workers poll); see "Wakeups"',
    ),
    Setting(
        "GATOR_WORKER_CONN_MAX_AGE",
        300,
        Number(0, none="unlimited"),
        "seconds a worker keeps a database connection when `CONN_MAX_AGE` is 0",
    ),
    Setting(
        "GATOR_WARM_CONNECTIONS",
        None,
        Names("`DATABASES` key", none="`default` and `GATOR_DATABASE`", aliases=True),
        "database aliases each executor thread opens before it takes a job, so jobs never "
        'connect in their pickup (`[]`: connect at a job\'s first query); see "Connections"',
    ),
    Setting(
        "GATOR_WORKER_NETWORK_TIMEOUT",
        None,
        Number(0, 999_999, none="`GATOR_HEARTBEAT_TIMEOUT`"),
        "seconds of silence after which both ends give up a worker's database connection "
        "(`0`: the drivers' and servers' defaults); see \"Network partitions\"",
    ),
    Setting(
        "GATOR_MAX_TRACEBACK_CHARS",
        20_000,
        Number(100, whole=True),
        "traceback characters kept per attempt",
    ),
    Setting(
        "GATOR_REDACT",
        [
            "password",
            "passwd",
            "secret",
            "token",
            "api_key",
            "apikey",
            "access_key",
            "private_key",
            "authorization",
            "credit_card",
            "card_number",
            "cvv",
        ],
        Names("key name", sets=True),
        "argument keys (any case) whose values the admin and the logs never show",
        shown='`["password", "passwd", "secret", "token", ...]`',
    ),
    Setting(
        "GATOR_MIDDLEWARE",
        [],
        Names("dotted path", importable=True),
        "middleware wrapped around every job's `handle()`, outermost first",
    ),
    Setting(
        "GATOR_IMMEDIATE",
        False,
        Flag(),
        "run each job in the dispatching thread as soon as its row is committed (tests)",
    ),
    Setting(
        "GATOR_QUEUES",
        {},
        QueueTable(),
        "limits per queue: running jobs at once across every worker, starts per second, "
        'minute or hour (see "Flow control"); seeds the queue\'s row, which the admin can edit',
    ),
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
