"""Django settings of the admin-at-volume benchmark: the admin, django_gator and the soak's
job classes (for the workflows it creates), the database from ``DATABASE_URL``,
``GATOR_PARTITIONING`` from ``GATOR_VOLUME_PARTITIONING``, and the queues' figures read
at every scrape (``GATOR_METRICS_CACHE_SECONDS = 0``: the cost a scrape has when its cache
has expired, not the cached answer)."""

from __future__ import annotations

import os

import environ

SECRET_KEY = "django-gator-admin-volume"  # noqa: S105 - a local benchmark, never served
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": environ.Env().db_url_config(os.environ["DATABASE_URL"])}
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_gator",
    "benchmarks.soak.app",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "benchmarks.admin_volume.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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
STATIC_URL = "/static/"
GATOR_PARTITIONING = os.environ.get("GATOR_VOLUME_PARTITIONING") or None
GATOR_METRICS_CACHE_SECONDS = 0
GATOR_QUEUES = {"soak-limited": {"concurrency": 3}}
