"""A web-like dispatching process of the soak (``--web N`` starts N of them): what a Django
site's views and scripts do to the queue, at a fixed rate, from a process of its own.

Each unit of the rate is one ``soak.web`` job (app/jobs.py), dispatched as one of:

- ``single``: ``SoakWeb.dispatch(...)`` in autocommit, as a script or an API call would;
- ``atomic``: inside ``transaction.atomic()`` (the row is written in the view's
  transaction and exists once it commits), with a read of the database first, as a view
  that looks something up before it dispatches;
- ``on_commit``: inside ``transaction.atomic()`` with ``dispatch(..., on_commit=True)`` (the
  INSERT waits for the commit);
- ``rollback``: a view whose transaction fails after it dispatched (either way): the job
  must never exist, and never run;
- ``delayed``: ``dispatch(..., wait=5 to 30 s)``;
- ``burst``: ``dispatch_many`` of 20 to 100 jobs (an import, a fan-out), counted as that
  many units.

A share of the jobs (``--fail-share``) fail their first attempt or two, then succeed. Each
dispatch call (an atomic block: from its start to its commit) is timed in this process
and written to the soak's timing files (kinds ``dispatch``, ``dispatch_many``: app/timing.py),
and each token to the files ledger once committed (app/ledger.py).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any

#: Shares of the units by way of dispatching (the rest: ``single``).
DEFAULT_WAYS = "atomic=0.25,on_commit=0.15,rollback=0.02,delayed=0.08,burst=0.3"
WAYS = ("single", "atomic", "on_commit", "rollback", "delayed", "burst")
TICK = 0.02


class Rollback(Exception):
    """The failing view's error (its transaction rolls back)."""


def ways(text: str) -> dict[str, float]:
    shares: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, share = part.partition("=")
        if name not in WAYS:
            raise argparse.ArgumentTypeError(f"unknown way {name!r}; known: {', '.join(WAYS)}")
        try:
            shares[name] = float(share)
        except ValueError:
            raise argparse.ArgumentTypeError(f"share must be a number: {part!r}") from None
    total = sum(shares.values())
    if not 0 <= total <= 1 or any(v < 0 for v in shares.values()):
        raise argparse.ArgumentTypeError(f"shares must be >= 0 and add up to <= 1: {text!r}")
    shares["single"] = shares.get("single", 0.0) + 1 - total
    return shares


class Dispatcher:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.names = list(args.ways)
        self.weights = [args.ways[n] for n in self.names]
        self.sequence = 0
        self.pending_burst = 0
        self.next_burst = self.rng.randint(20, 100)

    def token(self) -> str:
        self.sequence += 1
        return f"w{self.args.index}-{self.sequence}"

    def kwargs(self) -> dict[str, Any]:
        fails = 0
        if self.rng.random() < self.args.fail_share:
            fails = self.rng.choice((1, 2))
        return {"token": self.token(), "fails": fails, "ms": round(self.rng.uniform(0, 3), 2)}

    def run(self) -> None:
        start = time.monotonic()
        end = start + self.args.duration
        units = 0
        while (now := time.monotonic()) < end:
            due = int(self.args.rate * (now - start)) - units
            for way in self.rng.choices(self.names, self.weights, k=max(due, 0)):
                self.unit(way)
            units += max(due, 0)
            time.sleep(max(TICK - (time.monotonic() - now), 0.0))
        if self.pending_burst:
            self.burst(self.pending_burst)

    def unit(self, way: str) -> None:
        if way == "burst":
            self.pending_burst += 1
            if self.pending_burst >= self.next_burst:
                self.burst(self.pending_burst)
                self.pending_burst = 0
                self.next_burst = self.rng.randint(20, 100)
            return
        getattr(self, way)()

    def timed(self, kind: str, action: Any, rows: int = 1) -> Any:
        from benchmarks.soak.app import timing

        started = time.perf_counter()
        result = action()
        timing.record(kind, time.perf_counter() - started, rows)
        return result

    def committed(self, kwargs: dict[str, Any]) -> None:
        from benchmarks.soak.app import ledger

        ledger.write("dispatched", kwargs["token"])

    def single(self) -> None:
        from benchmarks.soak.app.jobs import SoakWeb

        kwargs = self.kwargs()
        self.timed("dispatch", lambda: SoakWeb.dispatch(**kwargs))
        self.committed(kwargs)

    def delayed(self) -> None:
        from benchmarks.soak.app.jobs import SoakWeb

        kwargs = self.kwargs()
        wait = round(self.rng.uniform(5, 30), 1)
        self.timed("dispatch", lambda: SoakWeb.dispatch(**kwargs, wait=wait))
        self.committed(kwargs)

    def atomic(self, on_commit: bool = False) -> None:
        from django.db import connection, transaction

        from benchmarks.soak.app.jobs import SoakWeb

        kwargs = self.kwargs()

        def view() -> None:
            with transaction.atomic():
                with connection.cursor() as cursor:  # the view's own read
                    cursor.execute("SELECT count(*) FROM gator_soak_callbackrun WHERE id < 10")
                SoakWeb.dispatch(**kwargs, on_commit=True if on_commit else None)
                transaction.on_commit(lambda: self.committed(kwargs))

        self.timed("dispatch", view)

    def on_commit(self) -> None:
        self.atomic(on_commit=True)

    def rollback(self) -> None:
        from django.db import transaction

        from benchmarks.soak.app import ledger
        from benchmarks.soak.app.jobs import SoakWeb

        kwargs = self.kwargs()
        try:
            with transaction.atomic():
                SoakWeb.dispatch(**kwargs, on_commit=True if self.rng.random() < 0.5 else None)
                raise Rollback
        except Rollback:
            ledger.write("rolledback", kwargs["token"])

    def burst(self, size: int) -> None:
        from benchmarks.soak.app.jobs import SoakWeb

        items = [self.kwargs() for _ in range(size)]
        self.timed("dispatch_many", lambda: SoakWeb.dispatch_many(items), size)
        for kwargs in items:
            self.committed(kwargs)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak.web", description=__doc__)
    p.add_argument("--index", type=int, required=True, help="this process's number")
    p.add_argument("--rate", type=float, required=True, help="jobs/s from this process")
    p.add_argument("--duration", type=float, required=True, help="seconds")
    p.add_argument("--ways", type=ways, default=ways(DEFAULT_WAYS), help=DEFAULT_WAYS)
    p.add_argument("--fail-share", type=float, default=0.03, help="jobs that fail 1-2 times")
    p.add_argument("--seed", type=int, default=15)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if "GATOR_SOAK_TIMINGS" not in os.environ:
        print("started by the soak harness only (GATOR_SOAK_TIMINGS unset)", file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.soak.settings")
    import django

    django.setup()
    from benchmarks.soak.app import ledger

    Dispatcher(args).run()
    ledger.flush()
    from benchmarks.soak.app import timing

    timing.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
