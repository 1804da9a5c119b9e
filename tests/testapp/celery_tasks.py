"""Tasks of the Celery-compatible front, one per mapped option (tests/test_celery*.py)."""

from __future__ import annotations

import threading
import time

from django_gator.celery import shared_task

#: Attempts seen, by key.
SEEN: dict[str, list[dict[str, object]]] = {}
#: Set by a test to let `blocks` end.
RELEASE = threading.Event()
STARTED = threading.Event()


class Flaky(OSError):
    pass


def _seen(key: str, **what: object) -> int:
    SEEN.setdefault(key, []).append(what)
    return len(SEEN[key])


@shared_task
def add(x, y):
    return x + y


@shared_task(name="celery-tests.renamed")
def renamed():
    return "renamed"


@shared_task(bind=True)
def who(self, key):
    _seen(key, id=self.request.id, retries=self.request.retries)
    return self.request.id


@shared_task(queue="emails", priority=7)
def on_emails(n):
    return n


@shared_task(bind=True, max_retries=2, default_retry_delay=42)
def retries_by_hand(self, key):
    _seen(key, retries=self.request.retries)
    raise self.retry(exc=Flaky(f"{key} failed"))


@shared_task(bind=True, max_retries=5)
def retries_with_its_own_limit(self, key):
    _seen(key)
    raise self.retry(countdown=1, max_retries=1)


@shared_task(autoretry_for=(Flaky,), max_retries=2, default_retry_delay=5)
def autoretried(key, error):
    _seen(key)
    raise (Flaky if error == "flaky" else KeyError)(key)


@shared_task(
    autoretry_for=(Flaky,),
    retry_backoff=2,
    retry_backoff_max=10,
    retry_jitter=False,
    max_retries=None,
)
def backs_off(key):
    _seen(key)
    raise Flaky(key)


@shared_task(autoretry_for=(Flaky,), retry_backoff=True, retry_jitter=True, max_retries=None)
def backs_off_with_jitter(key):
    _seen(key)
    raise Flaky(key)


@shared_task(rate_limit="60/m")  # Celery: one start a second
def limited(n):
    return n


@shared_task(time_limit=0.5)
def overruns():
    for _ in range(200):
        time.sleep(0.05)
    return "finished"


@shared_task(acks_late=True, ignore_result=True)
def forgets(n):
    return n * 2


@shared_task(expires=60)
def expiring():
    return "ran"


@shared_task
def blocks():
    STARTED.set()
    RELEASE.wait(20)
    return "released"


@shared_task
def fails():
    raise ValueError("no good")


@shared_task
def total(numbers):
    return sum(numbers)


@shared_task
def pair(a, b="b"):
    return [a, b]
