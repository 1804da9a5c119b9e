"""The declared table of the ``GATOR_*`` settings: name, default, allowed values, meaning.

The settings reference page (docs/reference/settings.md) is generated from this table when
the site is built (scripts/docs_reference.py); a new setting is added here, with its meaning
(tests/test_docs_site.py requires one) and bad values in tests/test_conf.py's BAD."""

from __future__ import annotations

from django_gator.conf.periodic import PERIODIC
from django_gator.conf.rules import (
    Delays,
    Flag,
    HostPort,
    LogLevel,
    Names,
    Number,
    QueueRoutes,
    QueueTable,
    Setting,
    Table,
    Text,
)

_CORE: tuple[Setting, ...] = (
    Setting(
        "GATOR_DATABASE",
        "default",
        Text("a key of `DATABASES`"),
        "database alias of the jobs table",
        checked_by="django_gator.E002",
    ),
    Setting(
        "GATOR_QUEUE_DATABASES",
        {},
        QueueRoutes(),
        "queues whose jobs live in another job database than `GATOR_DATABASE` (run "
        "`migrate --database` for each alias, and add `django_gator.routers.JobDatabaseRouter`"
        ' to `DATABASE_ROUTERS`); see "Several job databases"',
        checked_by="django_gator.E008",
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
        "GATOR_JOB_LOG_LEVEL",
        None,
        LogLevel("no capture"),
        "level from which the log records an attempt emits are captured and kept with it, "
        'for job classes that set no `log_level` of their own; see "Captured logs"',
    ),
    Setting(
        "GATOR_JOB_LOG_LINES",
        500,
        Number(1, whole=True),
        "captured log lines kept per attempt (the newest; older ones are counted as dropped)",
    ),
    Setting(
        "GATOR_JOB_LOG_BYTES",
        65_536,
        Number(256, whole=True),
        "bytes (UTF-8) of captured log lines kept per attempt (the newest lines; a longer "
        "line is cut)",
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
        "GATOR_NOTIFY",
        True,
        Flag(),
        "PostgreSQL: dispatch wakes idle workers with `NOTIFY` (`False`: with the wakeup "
        "datagrams of `GATOR_WAKEUP_BIND`, as on SQLite and MariaDB, so that concurrent "
        'dispatches do not queue on PostgreSQL\'s notification lock); see "Wakeups"',
    ),
    Setting(
        "GATOR_WAKEUP_BIND",
        "127.0.0.1:0",
        HostPort("port 0 picks a free one"),
        "SQLite, MariaDB/MySQL (PostgreSQL with `GATOR_NOTIFY = False`): the UDP address a "
        "worker binds for wakeups from dispatch "
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
        Names(
            "`DATABASES` key",
            none="`default`, `GATOR_DATABASE` and the job database served",
            aliases=True,
        ),
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
        "GATOR_ENCRYPTION_KEYS",
        [],
        Names("Fernet key"),
        "keys that encrypt the data of job classes with `encrypted = True`, newest first "
        "(each URL-safe base64 of 32 bytes; the newest encrypts, all decrypt); see "
        "docs/encryption.md",
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
        "GATOR_FAIRNESS",
        {},
        Table('dict `{queue: {"weights": {fairness key: weight}}}`'),
        "the fair queues: their jobs are claimed in weighted fair share between the "
        "fairness keys (tenants) with waiting work; a key not weighted weighs 1 (see "
        "docs/fairness.md)",
        checked_by="django_gator.E013",
    ),
)

#: Every setting, in the reference page's order: the core ones above, then cron, pruning
#: and metrics.
SETTINGS: tuple[Setting, ...] = _CORE + PERIODIC
