"""The project's tasks, written for Celery; only the imports changed."""

# Celery:
#   from celery import chord, shared_task
#   from celery.exceptions import MaxRetriesExceededError
from django_gator.celery import chord, shared_task
from django_gator.celery.exceptions import MaxRetriesExceededError
from tests.celery_sample.celery_app import app

#: What the flaky service has been asked, by key (the tests read it).
CALLS: dict[str, int] = {}


class ServiceDown(ConnectionError):
    pass


@app.task
def add(x, y):
    return x + y


@shared_task
def mul(x, y):
    return x * y


@shared_task(name="sample.total")
def total(numbers):
    return sum(numbers)


@shared_task(bind=True, max_retries=3, default_retry_delay=0)
def fetch(self, key, failures):
    """Fails ``failures`` times, then answers; retried by hand, as Celery's docs show."""
    CALLS[key] = CALLS.get(key, 0) + 1
    try:
        if CALLS[key] <= failures:
            raise ServiceDown(f"{key}: down ({CALLS[key]})")
    except ServiceDown as exc:
        raise self.retry(exc=exc, countdown=0) from exc
    return {"key": key, "calls": CALLS[key], "retries": self.request.retries}


@shared_task(bind=True, autoretry_for=(ServiceDown,), retry_backoff=True, max_retries=2)
def sync_account(self, account_id):
    """Retried automatically on ServiceDown, with Celery's exponential backoff."""
    CALLS[f"sync-{account_id}"] = CALLS.get(f"sync-{account_id}", 0) + 1
    raise ServiceDown(f"account {account_id}: down")


@shared_task(bind=True, max_retries=1)
def give_up(self):
    try:
        raise self.retry(countdown=0)
    except MaxRetriesExceededError:
        return "gave up"


@shared_task(bind=True, queue="emails")
def whoami(self):
    return {"id": self.request.id, "queue": self.request.delivery_info["routing_key"]}


@shared_task(ignore_result=True)
def log_line(text):
    return text


def sum_of_doubles(numbers):
    """Fans out one add per number, then totals them."""
    return chord((add.s(n, n) for n in numbers), total.s()).delay()
