"""``python -m tests.failover_dispatcher OUT_FILE SECONDS [COUNT]``: dispatch jobs one at a
time, as a web process does (autocommit, one INSERT per call), for SECONDS (or until COUNT
dispatches returned), writing ``<job id> <label>`` to OUT_FILE for each dispatch that
*returned*, flushed at once: the jobs a caller was told exist. A dispatch that raised (the
server went away meanwhile) is not written, and the loop goes on after a short pause.
Every third job is atomic (AtomicRecord), the others plain (OutageTolerantRecord).

Run by tests/reliability/test_failover.py against a throwaway cluster.
"""

from __future__ import annotations

import os
import sys
import threading
import time


def main() -> None:
    import django

    out_path, seconds = sys.argv[1], float(sys.argv[2])
    count = int(sys.argv[3]) if len(sys.argv) > 3 else None
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django.db import close_old_connections

    from tests.testapp.jobs import AtomicRecord, OutageTolerantRecord

    deadline = time.monotonic() + seconds
    returned = failed = 0
    with open(out_path, "w", buffering=1) as out:
        index = 0
        while time.monotonic() < deadline and (count is None or returned < count):
            label = f"d{index}"
            try:
                if index % 3 == 2:
                    job = AtomicRecord.dispatch(label)
                else:
                    job = OutageTolerantRecord.dispatch(label=label)
            except Exception as exc:  # the server went away: this dispatch did not return
                failed += 1
                print(f"dispatch {label} raised {exc!r}", file=sys.stderr, flush=True)
                close_old_connections()
                threading.Event().wait(0.05)
            else:
                out.write(f"{job.pk} {label}\n")
                returned += 1
            index += 1
            threading.Event().wait(0.005)
    print(f"returned {returned} failed {failed}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
