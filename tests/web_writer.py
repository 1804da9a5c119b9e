"""A stand-in for a web process: ``python -m tests.web_writer N`` runs N short
``transaction.atomic()`` blocks, each writing a row and dispatching a job, as views do.
Any exception (such as SQLite's "database is locked") escapes and exits non-zero."""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    import django

    django.setup()
    from django.db import transaction

    from tests.testapp.jobs import RecordOnce
    from tests.testapp.models import Execution

    count = int(sys.argv[1])
    started = time.monotonic()
    for i in range(count):
        with transaction.atomic():
            Execution.objects.create(job_id=-1 - i, attempt=0, pid=os.getpid(), label="web")
            RecordOnce.dispatch(label=f"web{i}")
        time.sleep(0.002)
    print(f"web writer: {count} transactions in {time.monotonic() - started:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
