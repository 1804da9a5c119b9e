"""The project's Celery app, as ``proj/celery.py`` of a Django project on Celery."""

# Celery:
#   from celery import Celery
from django_gator.celery import Celery

app = Celery("sample")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["tests.celery_sample"])
