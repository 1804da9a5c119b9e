"""``python -m benchmarks.dispatch_concurrency``: single dispatches from several processes at
once, as web processes send them, with PostgreSQL's NOTIFY and without it.

PostgreSQL serializes the commits of the transactions that sent a NOTIFY: each takes one
lock for the whole database before its commit and keeps it through the commit's WAL flush,
so concurrent notifying commits cannot share a flush. This measures what that costs a
dispatch: ``--processes`` processes (default 1, 4, 8), each calling ``dispatch()`` in
autocommit in a loop for ``--seconds``, the total rate per mode:

- ``notify``: ``GATOR_NOTIFY = True`` (the default): the NOTIFY rides in each INSERT;
- ``datagrams``: ``GATOR_NOTIFY = False``: no NOTIFY; after each commit a wakeup datagram
  to each of ``--targets`` registered workers (UDP sockets this benchmark binds and reads,
  standing in for worker processes serving the queue);
- ``raw`` and ``raw-notify``: psycopg alone, the same INSERT without and with
  ``pg_notify()`` in its RETURNING list (what the driver and the server allow).

``--commit-delay-us`` makes each commit wait that long before its WAL flush (PostgreSQL's
``commit_delay``, ``commit_siblings = 1``, set on the benchmark's database only): the
flush of a slower disk, or of a synchronous standby, which the notifying commits wait for
one at a time and the others share. ``--cluster sync-standby``
runs it on a throwaway primary whose commits each wait for a synchronous standby (both on
this machine), as a highly available deployment's do. The modes take turns going first
round by round; the database's name must contain ``raw`` (every job in it is deleted).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import threading
import time
from typing import Any

MODES = ("notify", "datagrams", "raw", "raw-notify")
RAW_SQL = (
    "INSERT INTO django_gator_job (name, args, kwargs, queue, priority, next_execution_at, "
    "created_at) VALUES (%s, %s::jsonb, '{{}}'::jsonb, %s, 0, statement_timestamp(), "
    "statement_timestamp()) RETURNING id, created_at{}"
)


def _setup(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.pickup.settings")
    import django

    django.setup()


def _dispatcher(url: str, mode: str, seconds: float, start: Any, out: Any, channel: str) -> None:
    """One process: dispatches until ``seconds`` after ``start`` is set; puts its count.
    ``channel``: the one dispatch NOTIFYs (``raw-notify`` sends on it too)."""
    if mode.startswith("raw"):
        import psycopg

        connection = psycopg.connect(_dsn(url), autocommit=True)
        notify = f", pg_notify('{channel}', 'raw')" if mode == "raw-notify" else ""
        sql = RAW_SQL.format(notify)

        def one(n: int) -> None:
            connection.execute(sql, ["raw.noop", json.dumps([n]), "bench"], prepare=True).fetchone()

    else:
        _setup(url)
        from django.conf import settings

        from django_gator.bench import BenchNoop

        settings.GATOR_NOTIFY = mode == "notify"
        BenchNoop.dispatch(-1)  # connected, the wakeup directory read

        def one(n: int) -> None:
            BenchNoop.dispatch(n)

    out.put("ready")
    start.wait()
    count = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        one(count)
        count += 1
    out.put(count)


def _dsn(url: str) -> str:
    return "postgresql://" + url.split("://", 1)[1]


def run_mode(url: str, mode: str, processes: int, seconds: float) -> float:
    from django_gator.engines.postgresql_sessions import CHANNEL

    context = multiprocessing.get_context("spawn")
    start, out = context.Event(), context.Queue()
    children = [
        context.Process(target=_dispatcher, args=(url, mode, seconds, start, out, CHANNEL))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    for _ in children:  # each set up (Django, its connection, the wakeup directory read)
        if out.get(timeout=120) != "ready":
            raise RuntimeError("a dispatching process did not start")
    start.set()
    counts = [out.get(timeout=seconds + 120) for _ in children]
    for child in children:
        child.join()
    return sum(counts) / seconds


class Targets:
    """Stand-ins for ``count`` idle worker processes of the benchmark's queue, each woken
    either way: a UDP socket registered as a live worker's wakeup address, and a
    connection LISTENing on the channel dispatch NOTIFYs, each read by a thread of its own
    (as workers read their wakeups) until closed. So both modes deliver their wakeups."""

    def __init__(self, count: int, url: str) -> None:
        import psycopg
        from django.db import connection

        from django_gator.bench import QUEUE
        from django_gator.engines import get_engine
        from django_gator.engines.postgresql_sessions import CHANNEL

        self.sockets = []
        self.received = 0
        self.notified = 0
        self.listeners = []
        engine = get_engine("default")
        for index in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind(("127.0.0.1", 0))
            sock.settimeout(0.2)
            host, port = sock.getsockname()
            engine.register_worker(
                f"bench-target-{index}",
                socket.gethostname(),
                os.getpid(),
                json.dumps([[QUEUE, 1]]),
                1,
                wakeup_address=f"{host}:{port}",
            )
            self.sockets.append(sock)
            listener = psycopg.connect(_dsn(url), autocommit=True)
            listener.execute(f"LISTEN {CHANNEL}")
            self.listeners.append(listener)
        connection.close()
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._read, args=(s,)) for s in self.sockets]
        self.threads += [threading.Thread(target=self._listen, args=(c,)) for c in self.listeners]
        for thread in self.threads:
            thread.start()
        self.beat = threading.Thread(target=self._heartbeat)
        self.beat.start()

    def _read(self, sock: socket.socket) -> None:
        while not self.stopped.is_set():
            try:
                sock.recv(2048)
                self.received += 1
            except TimeoutError:
                continue

    def _listen(self, listener: Any) -> None:
        while not self.stopped.is_set():
            for _ in listener.notifies(timeout=0.2):
                self.notified += 1

    def _heartbeat(self) -> None:
        from django.db import connection
        from django.utils import timezone

        from django_gator.models import Worker

        while not self.stopped.wait(5):
            Worker.objects.filter(id__startswith="bench-target-").update(
                heartbeat_at=timezone.now()
            )
        connection.close()

    def close(self) -> None:
        from django_gator.models import Worker

        self.stopped.set()
        for thread in [*self.threads, self.beat]:
            thread.join()
        for sock in self.sockets:
            sock.close()
        for listener in self.listeners:
            listener.close()
        Worker.objects.filter(id__startswith="bench-target-").delete()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--processes", type=int, action="append")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--targets", type=int, default=2, help="registered workers (datagrams)")
    parser.add_argument("--mode", choices=MODES, action="append")
    parser.add_argument("--synchronous-commit", choices=["on", "off"], default="on")
    parser.add_argument(
        "--commit-delay-us",
        type=int,
        default=0,
        help="PostgreSQL's commit_delay (with commit_siblings 1) for the run: each commit "
        "waits this long before its WAL flush, as on a disk or a synchronous standby "
        "slower than this machine's",
    )
    parser.add_argument(
        "--cluster",
        choices=["shared", "sync-standby"],
        default="shared",
        help="sync-standby: a throwaway PostgreSQL 15 primary with a synchronous streaming "
        "standby on this machine (each commit waits for the standby's flush), made and "
        "removed by the benchmark; --database-url is then ignored",
    )
    parser.add_argument("--json", help="write every round's rates to this file")
    args = parser.parse_args()
    if args.cluster == "sync-standby":
        from tests.clusters import standby_of, throwaway_cluster

        with throwaway_cluster() as primary, standby_of(primary, synchronous=True):
            primary.execute("CREATE DATABASE gator_raw")
            url = f"postgres://postgres@127.0.0.1:{primary.port}/gator_raw"
            _setup(url)
            from django.core.management import call_command

            call_command("migrate", verbosity=0)
            benchmark(args, url)
        return
    url = args.database_url or ""
    if not url.startswith(("postgres://", "postgresql://")) or "raw" not in url.rsplit("/", 1)[-1]:
        sys.exit(
            f"--database-url {url!r}: a PostgreSQL database whose name contains 'raw' "
            "(every job in it is deleted)"
        )
    _setup(url)
    benchmark(args, url)


def benchmark(args: argparse.Namespace, url: str) -> None:
    import psycopg

    modes = tuple(args.mode or MODES)
    processes = args.processes or [1, 4, 8]
    admin = psycopg.connect(_dsn(url), autocommit=True)
    database = url.rsplit("/", 1)[-1].split("?")[0]
    admin.execute(f"ALTER DATABASE {database} SET synchronous_commit TO {args.synchronous_commit}")
    admin.execute(f"ALTER DATABASE {database} SET commit_delay TO {args.commit_delay_us}")
    admin.execute(f"ALTER DATABASE {database} SET commit_siblings TO 1")
    targets = Targets(args.targets, url)
    rounds: list[dict[str, Any]] = []
    try:
        for count in processes:
            for number in range(args.rounds):
                order = modes[number % len(modes) :] + modes[: number % len(modes)]
                rates = {}
                for mode in order:
                    admin.execute("DELETE FROM django_gator_job")
                    admin.execute("VACUUM django_gator_job")
                    load = os.getloadavg()[0]
                    rates[mode] = run_mode(url, mode, count, args.seconds)
                    rounds.append(
                        {
                            "processes": count,
                            "round": number + 1,
                            "mode": mode,
                            "rate": rates[mode],
                            "load": load,
                        }
                    )
                print(
                    f"{count} processes, round {number + 1}: "
                    + ", ".join(f"{mode} {rates[mode]:,.0f}/s" for mode in modes),
                    flush=True,
                )
    finally:
        targets.close()
        admin.execute("DELETE FROM django_gator_job")
        for setting in ("synchronous_commit", "commit_delay", "commit_siblings"):
            admin.execute(f"ALTER DATABASE {database} RESET {setting}")
    print(f"\nmedians over {args.rounds} rounds (dispatches a second, all processes):")
    for count in processes:
        medians = {
            mode: statistics.median(
                r["rate"] for r in rounds if r["processes"] == count and r["mode"] == mode
            )
            for mode in modes
        }
        line = ", ".join(f"{mode} {rate:,.0f}" for mode, rate in medians.items())
        if "notify" in medians and "datagrams" in medians:
            line += f"; datagrams / notify {medians['datagrams'] / medians['notify']:.2f}"
        print(f"  {count} processes: {line}")
    print(
        f"  wakeups received by the {args.targets} stand-in workers: {targets.received:,} "
        f"datagrams, {targets.notified:,} notifications"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"arguments": vars(args), "rounds": rounds}, handle, indent=1)


if __name__ == "__main__":
    main()
