"""Settings of the django-gator demo project.

Everything that differs between machines comes from the environment (django-environ):

    DATABASE_URL   default: SQLite in testproject/db.sqlite3
                   e.g. postgres://postgres@127.0.0.1:5432/test, mysql://root@127.0.0.1:3306/test
    DEBUG          default: True
    SECRET_KEY     default: a development key (set a real one anywhere public)
    ALLOWED_HOSTS  comma-separated; default: localhost, 127.0.0.1, [::1]
    GATOR_LOG_LEVEL  level of the django_gator loggers on the console; default: INFO
    GATOR_ENCRYPTION_KEYS  comma-separated keys for encrypted jobs, newest first (each from
                   Fernet.generate_key()); default: a development key (never use it for real data)
    GATOR_PARTITIONING  "day" or "hour": partitioned storage (PostgreSQL; gator_partitions
                   --convert first); default: a plain jobs table
"""

from __future__ import annotations

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-gator-demo-only-not-for-production")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_gator",
    "demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"
WSGI_APPLICATION = "testproject.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# SQLite is the default; whatever the URL, a SQLite database gets the options that make it
# work with a worker and a web server at once: IMMEDIATE transactions (writers queue for the
# lock instead of failing with "database is locked" when a read turns into a write), WAL
# (readers do not block the writer) and a 20 s busy timeout.
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "timeout": 20,
        }
    )
elif DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("charset", "utf8mb4")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

# Flow control: at most 2 exports run at once across every worker, at most 10 start a
# second (the admin's dashboard can change them; see docs/guides/flow-control.md).
GATOR_QUEUES = {"exports": {"concurrency": 2, "rate_limit": "10/s"}}

# Keys of encrypted jobs (demo.jobs.SendStatement), newest first: see docs/encryption.md.
GATOR_ENCRYPTION_KEYS = env.list(
    "GATOR_ENCRYPTION_KEYS", default=["ZGVtby1vbmx5LWtleS1ub3QtZm9yLXJlYWwtZGF0YSE="]
)
# Partitioned storage of the jobs table (PostgreSQL), for the benchmarks of docs/benchmarks.md.
GATOR_PARTITIONING = env.str("GATOR_PARTITIONING", default=None)

# Workers import each app's `tour` module too, besides `jobs` (demo/tour.py).
GATOR_AUTODISCOVER = ["tour"]

# Middleware wrapped around every job's handle() (see demo/jobs.py).
GATOR_MIDDLEWARE = ["demo.jobs.log_duration"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "console": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "console"},
    },
    "loggers": {
        # Workers log every job they process; dispatch logs every job it enqueues.
        "django_gator": {
            "handlers": ["console"],
            "level": env.str("GATOR_LOG_LEVEL", default="INFO"),
            "propagate": False,
        },
        # The demo jobs log what they "do".
        "demo": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}

# The demo's SendWelcomeEmail job "sends" its mail to the worker's console.
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
