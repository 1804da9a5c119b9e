"""Measure one peer with one worker layout; prints one JSON object on its last line.

Run by ``python -m benchmarks.peers`` in a process of its own per peer and layout, with
``BENCH_PEER`` and ``BENCH_PROCESSES`` set, on a freshly created database.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.peers.settings")
django.setup()

from django.core.management import call_command  # noqa: E402

from benchmarks.peers.benchapp.work import DRAIN_KEY, PROBE_KEY, ledger  # noqa: E402
from benchmarks.peers.peers import FAST, PEERS, QUEUE, Peer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Sizes:
    noop: int = 5000
    write: int = 2000
    single: int = 1000
    #: The single enqueues run this many times (each after a purge); the median rate is
    #: reported: one run of 1,000 commits lasts under a second, and one slow fsync moves it.
    single_rounds: int = 3
    bulk: int = 10000
    #: Latency probes of each kind (the Redis probe and the row-writing probe, alternated)
    #: in each condition: right after the workers start, and after a drain.
    probes: int = 100
    backlog_probes: int = 100
    #: Longest wait for a drain, in seconds: a slower peer is reported from what it did.
    limit: float = 90.0


@dataclass
class Result:
    peer: str
    processes: int
    note: str = ""
    figures: dict[str, float | None] = field(default_factory=dict)
    remarks: list[str] = field(default_factory=list)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class Workers:
    """The peer's worker processes, each in a session of its own (so a stop reaches the
    children a peer forks), their output in a log file."""

    def __init__(self, peer: Peer, processes: int, logdir: Path) -> None:
        self.peer, self.processes, self.logdir = peer, processes, logdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        env = {**os.environ, "BENCH_PROCESSES": str(self.processes)}
        for i, command in enumerate(self.peer.worker_commands(self.processes)):
            log = open(self.logdir / f"{self.peer.name}-{self.processes}-{i}.log", "ab")  # noqa: SIM115
            self.procs.append(
                subprocess.Popen(
                    command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )  # fmt: skip

    def check(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{self.peer.name}: worker {proc.args} exited with {proc.returncode}; "
                    f"see {self.logdir}"
                )

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group
            proc.wait()
        self.procs = []


@contextmanager
def running(workers: Workers) -> Iterator[Workers]:
    workers.start()
    try:
        yield workers
    finally:
        workers.stop()


def starts(key: str) -> list[float]:
    return [float(item.split()[1]) for item in ledger().lrange(key, 0, -1)]


def drain(
    peer: Peer,
    workers: Workers,
    kind: str,
    count: int,
    sizes: Sizes,
    then: Callable[[bool], None] | None = None,
) -> tuple[float | None, float | None]:
    """``count`` jobs enqueued before the workers start (so that neither enqueueing nor
    start-up is in the figures); returns the rate over the middle 90 % of the jobs' starts
    (steady state, without the ramp-up and the stragglers) and the seconds from the first
    start to the last (which includes them). ``then`` runs once the drain is over, with the
    workers still up (the latency probes "after a drain"), told whether every job ran."""
    peer.purge()
    ledger().delete(DRAIN_KEY)
    enqueue(peer, kind, range(count), QUEUE)
    with running(workers):
        deadline = time.monotonic() + sizes.limit + 30
        while ledger().llen(DRAIN_KEY) < count and time.monotonic() < deadline:
            workers.check()
            time.sleep(0.05)
        if then is not None:
            then(ledger().llen(DRAIN_KEY) >= count)
    times = sorted(starts(DRAIN_KEY))
    if len(times) < 20:
        return None, None
    low, high = round(len(times) * 0.05), round(len(times) * 0.95) - 1
    rate = (high - low) / max(times[high] - times[low], 1e-9)
    return rate, times[-1] - times[0]


def enqueue(peer: Peer, kind: str, numbers: Sequence[int], queue: str) -> None:
    if peer.has_bulk:
        for at in range(0, len(numbers), 10000):
            peer.enqueue_many(kind, numbers[at : at + 10000], queue)
    else:
        for number in numbers:
            peer.enqueue(kind, number, queue)


def probe(peer: Peer, number: int, queue: str, timeout: float = 30.0) -> float | None:
    """Enqueue one Redis probe (in autocommit) and wait for it to start: seconds from the
    moment the enqueue call returned (the job committed) to the job's start. The job never
    touches the database."""
    peer.enqueue("probe", number, queue)
    committed = time.time()
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        item = ledger().blpop([PROBE_KEY], timeout=max(left, 0.01))
        if item is None:
            return None
        tag, started = item[1].split()
        if int(tag) == number:
            return float(started) - committed
        if int(tag) > number:
            raise RuntimeError(f"probe {number} saw probe {tag}")
        # An earlier probe that timed out has started since: not this one's figure.
    return None


#: How long the driver sleeps between two reads of the probe table.
ROW_POLL = 0.001


def row_probe(peer: Peer, number: int, queue: str, timeout: float = 30.0) -> RowSample | None:
    """Enqueue one row-writing probe (in autocommit) and poll the probe table, from this
    process's own connection, until its row is there: seconds from the return of the
    enqueue call to the return of the read that first saw the row (``seen``), and to the
    start time the job wrote into it (``started``)."""
    from django.db import connection

    from benchmarks.peers.benchapp.models import ProbeRow

    sql = f"SELECT started FROM {ProbeRow._meta.db_table} WHERE number = %s"
    peer.enqueue("row", number, queue)
    committed = time.time()
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while True:
            cursor.execute(sql, [number])
            row = cursor.fetchone()
            if row is not None:
                return RowSample(seen=time.time() - committed, started=row[0] - committed)
            if time.monotonic() > deadline:
                return None
            time.sleep(ROW_POLL)


@dataclass
class RowSample:
    seen: float
    started: float


def latency_figures(prefix: str, samples: list[float]) -> dict[str, float | None]:
    quantiles = (50, 90, 95, 99)
    if not samples:
        return {f"{prefix}_p{q}_ms": None for q in quantiles}
    return {f"{prefix}_p{q}_ms": percentile(samples, q) * 1000 for q in quantiles}


def probes(peer: Peer, condition: str, sizes: Sizes, result: Result) -> None:
    """``sizes.probes`` of each kind, one at a time, 20-50 ms apart, alternated (the Redis
    probe first, then the row-writing one): ``start_<condition>_*`` from the Redis probe,
    ``row_<condition>_*`` from the row-writing probe's ``seen`` (the start time it wrote
    in ``rowstart_<condition>_*``), and the first row-writing probe's ``seen`` alone."""
    from benchmarks.peers.benchapp.models import ProbeRow

    ProbeRow.objects.all().delete()
    ledger().delete(PROBE_KEY)
    starts_: list[float] = []
    rows: list[RowSample] = []
    for number in range(sizes.probes):
        time.sleep(random.uniform(0.02, 0.05))
        seconds = probe(peer, number, QUEUE)
        if seconds is not None:
            starts_.append(seconds)
        time.sleep(random.uniform(0.02, 0.05))
        sample = row_probe(peer, number, QUEUE)
        if sample is not None:
            rows.append(sample)
    figures = result.figures
    figures.update(latency_figures(f"start_{condition}", starts_))
    figures.update(latency_figures(f"row_{condition}", [r.seen for r in rows]))
    figures.update(latency_figures(f"rowstart_{condition}", [r.started for r in rows]))
    figures[f"row_{condition}_first_ms"] = rows[0].seen * 1000 if rows else None
    for kind, got in (("Redis", len(starts_)), ("row-writing", len(rows))):
        if got < sizes.probes:
            result.remarks.append(f"{sizes.probes - got} {kind} probes timed out ({condition})")


def measure(peer: Peer, processes: int, sizes: Sizes, logdir: Path) -> Result:
    result = Result(peer.name, processes, peer.note)
    figures = result.figures
    workers = Workers(peer, processes, logdir)

    # (c) enqueue, no worker running: one at a time in autocommit, and in bulk.
    peer.purge()
    for number in range(20):  # warm up: connections, imports, first plans
        peer.enqueue("noop", number)
    rates = []
    for _ in range(sizes.single_rounds):
        peer.purge()
        began = time.perf_counter()
        for number in range(sizes.single):
            peer.enqueue("noop", number)
        rates.append(sizes.single / (time.perf_counter() - began))
    figures["enqueue_per_s"] = statistics.median(rates)
    if peer.has_bulk:
        peer.purge()
        numbers = range(sizes.bulk)
        began = time.perf_counter()
        peer.enqueue_many("noop", numbers)
        figures["bulk_enqueue_per_s"] = sizes.bulk / (time.perf_counter() - began)
    else:
        figures["bulk_enqueue_per_s"] = None
        result.remarks.append("no bulk enqueue")

    # (a) no-op jobs and (b) the realistic job: drain rates.
    # (d) pickup latency, both probes, after the write drain: the workers stay up once its
    # jobs are done, every thread having run jobs that used the database.
    figures["noop_per_s"], figures["noop_seconds"] = drain(peer, workers, "noop", sizes.noop, sizes)

    def after_drain(finished: bool) -> None:
        if finished:
            probes(peer, "drained", sizes, result)
        else:
            result.remarks.append("the write drain did not finish: no probes after a drain")

    figures["write_per_s"], figures["write_seconds"] = drain(
        peer, workers, "write", sizes.write, sizes, then=after_drain
    )

    # (d) pickup latency, both probes, right after the workers start: the first moment a
    # Redis probe (which opens no database connection) shows them taking jobs.
    peer.purge()
    ledger().delete(PROBE_KEY, DRAIN_KEY)
    with running(workers):
        if probe(peer, -1, QUEUE, timeout=60) is None:  # the workers are up
            raise RuntimeError(f"{peer.name}: the warm-up job never started; see {logdir}")
        probes(peer, "fresh", sizes, result)

    # (e) pickup latency of a job on another queue while a backlog drains.
    if not peer.has_queues:
        figures.update(latency_figures("backlog", []))
        result.remarks.append("one queue per worker: no backlog-latency figure")
        return result
    rate = figures["noop_per_s"] or 1000.0
    backlog = int(min(max(rate * 10, 2000), 60000))
    peer.purge()
    ledger().delete(PROBE_KEY, DRAIN_KEY)
    enqueue(peer, "noop", range(backlog), QUEUE)
    samples = []
    with running(workers):
        deadline = time.monotonic() + 60
        while ledger().llen(DRAIN_KEY) < min(200, backlog // 10):
            workers.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{peer.name}: the backlog never started; see {logdir}")
            time.sleep(0.01)
        for number in range(sizes.backlog_probes):
            if ledger().llen(DRAIN_KEY) >= backlog * 0.95:
                result.remarks.append(f"backlog drained after {len(samples)} probes")
                break
            seconds = probe(peer, number, FAST)
            if seconds is None:
                result.remarks.append(f"busy probe {number} timed out")
            else:
                samples.append(seconds)
            time.sleep(0.02)  # the Redis probe only: the backlog moves while a row is polled
    figures.update(latency_figures("backlog", samples))
    figures["backlog_samples"] = len(samples)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--peer", required=True, choices=sorted(PEERS))
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--logdir", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = Sizes(noop=300, write=200, single=100, bulk=1000, probes=10, backlog_probes=10,
                  limit=30) if args.quick else Sizes()  # fmt: skip
    logdir = args.logdir or Path(tempfile.mkdtemp(prefix="gator-peers-"))
    call_command("migrate", verbosity=0)
    result = measure(PEERS[args.peer], args.processes, sizes, logdir)
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
