"""Settings for the test suite. The database comes from DATABASE_URL (default: a SQLite
file, so that tests with threads and subprocesses share it)."""

from __future__ import annotations

import os
import tempfile

import environ

env = environ.Env()

SECRET_KEY = "django-gator-tests"
# The tests create many staff users; Django's default hasher spends about half a second
# of CPU on each password on purpose, which made the admin and security tests the slowest
# in-process tests of the suite. A fast hasher changes nothing they test.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_sqlite_path = os.path.join(tempfile.gettempdir(), "django-gator-tests.sqlite3")
DATABASES = {
    "default": env.db_url_config(os.environ.get("DATABASE_URL") or f"sqlite:///{_sqlite_path}")
}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    _db.setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            # SQLite's busy timeout; tests of a lock held past it shorten it.
            "timeout": float(os.environ.get("GATOR_TEST_SQLITE_TIMEOUT", "20")),
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    if "GATOR_TEST_SUBPROCESS" not in os.environ:
        # A file, not :memory:, so worker threads and subprocesses see the same database.
        _db["TEST"] = {
            "NAME": os.path.join(tempfile.gettempdir(), f"django-gator-test-{os.getpid()}.sqlite3")
        }
elif _db["ENGINE"] == "django.db.backends.mysql":
    _db.setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})
    _db["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_gator",
    "tests.testapp",
]
try:
    import django.tasks  # noqa: F401 - Django 6.0+
except ImportError:
    INSTALLED_APPS.append("django_tasks")  # the backport, on Django 5.2

# Django's Tasks framework on django-gator (tests/testapp/tasks.py).
TASKS = {
    "default": {
        "BACKEND": "django_gator.tasks.GatorBackend",
        "QUEUES": ["default", "tasks", "critical"],
    }
}
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# The fair queue of tests/test_fairness.py (docs/fairness.md); other queues stay ordinary.
GATOR_FAIRNESS = {"fair": {"weights": {"tenant:big": 3}}}

# Fast heartbeats so crash tests finish in seconds; subprocess workers inherit these.
GATOR_HEARTBEAT_INTERVAL = float(os.environ.get("GATOR_HEARTBEAT_INTERVAL", "0.5"))
GATOR_HEARTBEAT_TIMEOUT = float(os.environ.get("GATOR_HEARTBEAT_TIMEOUT", "3"))
GATOR_POLL_INTERVAL = float(os.environ.get("GATOR_POLL_INTERVAL", "0.05"))
# GATOR_TEST_NOTIFY=off: the suite with PostgreSQL's wakeups by datagram (GATOR_NOTIFY).
GATOR_NOTIFY = os.environ.get("GATOR_TEST_NOTIFY", "on") != "off"
GATOR_SCHEDULER_INTERVAL = float(os.environ.get("GATOR_SCHEDULER_INTERVAL", "0.05"))
# The scheduler's clock: a file the test moves forward (see tests/clock.py), or real time.
if os.environ.get("GATOR_TEST_CLOCK_FILE"):
    GATOR_SCHEDULER_CLOCK = "tests.clock.file_clock"
GATOR_SHUTDOWN_TIMEOUT = float(os.environ.get("GATOR_SHUTDOWN_TIMEOUT", "10"))
GATOR_MAX_RESCUES = int(os.environ.get("GATOR_MAX_RESCUES", "3"))
GATOR_OUTAGE_RETRIES = int(os.environ.get("GATOR_OUTAGE_RETRIES", "10"))
if "GATOR_ASYNC_COMMIT" in os.environ:  # tests/reliability/test_outages.py: durable success marks
    GATOR_ASYNC_COMMIT = os.environ["GATOR_ASYNC_COMMIT"] == "1"
GATOR_MAX_HANDBACKS = int(os.environ.get("GATOR_MAX_HANDBACKS", "3"))
GATOR_PROGRESS_INTERVAL = float(os.environ.get("GATOR_PROGRESS_INTERVAL", "2"))
# Unknown job names end dead at once in tests, unless a test waits for a deploy
# (tests/worker/test_unknown_names.py).
GATOR_UNKNOWN_JOB_WINDOW = float(os.environ.get("GATOR_UNKNOWN_JOB_WINDOW", "0"))

if os.environ.get("GATOR_TEST_DB_NAME") and _db["ENGINE"] != "django.db.backends.sqlite3":
    # Separate test databases for test runs that share a server at the same time.
    _db.setdefault("TEST", {})["NAME"] = os.environ["GATOR_TEST_DB_NAME"]

if os.environ.get("GATOR_TEST_PG_HOSTS") and _db["ENGINE"].endswith("postgresql"):
    # A primary that can move (tests/reliability/test_outages.py's failover): libpq tries each
    # HOST:PORT in turn and keeps the one that accepts writes, as on a managed database
    # with a standby (Patroni, RDS Multi-AZ without a DNS name).
    _hosts = [h.rsplit(":", 1) for h in os.environ["GATOR_TEST_PG_HOSTS"].split(",")]
    _db.update(HOST=",".join(h for h, _ in _hosts), PORT=",".join(p for _, p in _hosts))
    _db.setdefault("OPTIONS", {}).update(target_session_attrs="read-write", connect_timeout=5)

if os.environ.get("GATOR_TEST_PGBOUNCER_PORT") and _db["ENGINE"].endswith("postgresql"):
    # tests/reliability/test_pgbouncer.py: this process reaches the database through a PgBouncer in
    # transaction mode; "direct" is the same database without it (for LISTEN).
    DATABASES["direct"] = {**_db, "OPTIONS": dict(_db.get("OPTIONS") or {})}
    _db.update(HOST="127.0.0.1", PORT=int(os.environ["GATOR_TEST_PGBOUNCER_PORT"]))
    GATOR_POOLED_DATABASES = ["default"]
    if os.environ.get("GATOR_TEST_LISTEN_DATABASE"):
        GATOR_LISTEN_DATABASE = os.environ["GATOR_TEST_LISTEN_DATABASE"]

if os.environ.get("GATOR_TEST_JOB_DATABASES"):
    # tests/test_queue_databases.py: worker subprocesses reach the extra job databases of
    # the test (a JSON object of DATABASES entries) and its routes (GATOR_QUEUE_DATABASES).
    import json

    DATABASES.update(json.loads(os.environ["GATOR_TEST_JOB_DATABASES"]))
    GATOR_QUEUE_DATABASES = json.loads(os.environ["GATOR_TEST_QUEUE_DATABASES"])
if os.environ.get("GATOR_TEST_PARTITIONING") and _db["ENGINE"].endswith("postgresql"):
    # The suite on partitioned storage: tests/conftest.py converts the test database's jobs
    # table after migrating it (GATOR_TEST_PARTITIONING=day or hour).
    GATOR_PARTITIONING = os.environ["GATOR_TEST_PARTITIONING"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_gator": {
            "handlers": ["console"],
            "level": os.environ.get("GATOR_LOG_LEVEL", "WARNING"),
        }
    },
}

# Encrypted jobs (tests/test_encryption.py): fixed test-only keys, newest first. A worker
# subprocess takes another list from GATOR_TEST_ENCRYPTION_KEYS (a rotation test).
TEST_KEY_A = "sIfQyvVvRWTHWNymmgrF7RMiLZGOr-84FNhfnzcLuBU="
TEST_KEY_B = "ZDOjAqhe74Joi6xo9CXGw_xc9_H1wP1ueAVB_RmDCwE="
GATOR_ENCRYPTION_KEYS = os.environ.get("GATOR_TEST_ENCRYPTION_KEYS", TEST_KEY_A).split(",")
