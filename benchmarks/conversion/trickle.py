"""``python -m benchmarks.conversion.trickle RATE OUT STOP``: dispatch ``soak.ok`` jobs to
the queue ``conversion`` at RATE a second, each in autocommit (as a view does), until the
file STOP exists; then write one JSON line per dispatch to OUT: the wall-clock time it
started (``time.time()``), its duration in seconds, the job's id. A dispatch that fails is
written with its error instead of an id: the report counts it (none should)."""

from __future__ import annotations

import json
import os
import sys
import time


def main(rate: float, out: str, stop: str) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.soak.settings")
    import django

    django.setup()
    from benchmarks.soak.app.jobs import SoakOk

    records: list[dict[str, object]] = []
    interval = 1.0 / rate
    due = time.monotonic()
    while not os.path.exists(stop):
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)  # deliberate: the trickle's own pace
        due += interval
        started, clock = time.time(), time.perf_counter()
        try:
            job_id = SoakOk.dispatch(queue="conversion").pk
        except Exception as exc:  # counted in the report, never hidden
            records.append({"at": started, "s": time.perf_counter() - clock, "error": repr(exc)})
            continue
        records.append({"at": started, "s": time.perf_counter() - clock, "id": job_id})
    with open(out, "w") as file:
        for record in records:
            file.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]), sys.argv[2], sys.argv[3]))
