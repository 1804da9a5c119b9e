"""A stand-in for a web process: ``python -m tests.web_writer N`` runs N short
``transaction.atomic()`` blocks, each writing a row and dispatching a job, as views do.
Any exception (such as SQLite's "database is locked") escapes and exits non-zero.

``python -m tests.web_writer --seconds S --every E --report FILE`` commits one such
block every E seconds for S seconds instead (writing a row, dispatching nothing) and
keeps going after an error: it writes to FILE, as JSON, how long each commit took
(``latencies_ms``, from entering ``atomic()`` to having left it) and the error messages
of the blocks that failed (``errors``)."""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    import django

    django.setup()
    if sys.argv[1] == "--seconds":
        return timed(float(sys.argv[2]), float(sys.argv[4]), sys.argv[6])
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


def timed(seconds: float, every: float, report: str) -> int:
    from django.db import close_old_connections, transaction

    from tests.testapp.models import Execution

    latencies: list[float] = []
    errors: list[str] = []
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        i += 1
        started = time.monotonic()
        try:
            with transaction.atomic():
                Execution.objects.create(
                    job_id=-1_000_000 - i, attempt=0, pid=os.getpid(), label="web"
                )
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            close_old_connections()
        else:
            latencies.append((time.monotonic() - started) * 1000)
        time.sleep(max(every - (time.monotonic() - started), 0))
    with open(report, "w") as out:
        json.dump({"latencies_ms": latencies, "errors": errors}, out)
    print(f"web writer: {len(latencies)} commits, {len(errors)} errors in {seconds:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
