"""The ceiling: the highest dispatch rate whose backlog stays bounded, and what saturates.

Each step dispatches at a fixed rate for ``--hold`` seconds (600 in the published run) to
``--workers`` worker processes on the database's host, after a fresh start (jobs table
emptied and vacuumed, workers restarted). The backlog (jobs due and waiting) and the age of
the oldest of them are read every 2 s. A step is *bounded* when, over its second half, the
oldest due job was never older than ``--max-lag`` seconds, the backlog did not grow (its
least-squares slope at most 2 % of the rate per second) and the dispatcher sent at least
97 % of the rate (a dispatcher that cannot keep up is itself the limit, and is reported as
such). Throughput and claim latency are those of the second half. Rates rise step by step
(``--rates``) and the run stops at the first unbounded step: the ceiling is the highest
bounded rate. Every step carries what the watch saw (observe.py)
and a verdict naming the resource that ran out, by these rules, first match:

1. dispatcher: it sent less than 97 % of the rate;
2. CPU: the machine's CPUs were at least 90 % busy (this benchmark's processes against the
   rest: on a shared machine other programs' load shows here; the roles, largest first);
3. locks: at least 30 % of the active sessions' samples waited on a lock (Lock:*, LWLock:*,
   but for LWLock:WALWrite);
4. WAL / fsync I/O: at least 30 % of them waited on I/O (IO:*) or for the WAL to reach the
   disk (LWLock:WALWrite: a commit waiting for another backend's flush, which its own
   commit rides on), or a disk was busy 80 %;
5. otherwise nothing above saturated: the workers' threads (round trips, the GIL).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.fleet.observe import Watch
from benchmarks.fleet.runner import Bench, claim_latency

SAMPLE = 2.0
#: Bounded: the backlog grew by at most this share of the rate per second in the second half.
GROWTH = 0.02


def run(bench: Bench, options: Any) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for rate in options.rates:
        step = one_rate(bench, options, rate)
        steps.append(step)
        print(
            f"  {rate:,.0f}/s: {'bounded' if step['bounded'] else 'NOT bounded'}; done "
            f"{step['throughput']:,.0f}/s, largest lag {step['max_lag_s']:.1f} s, claim p99 "
            f"{step['claim']['p99_ms']} ms; {step['verdict']}",
            flush=True,
        )
        if not step["bounded"]:
            break
    bounded = [step["rate"] for step in steps if step["bounded"]]
    return {
        "hold_s": options.hold,
        "max_lag_s": options.max_lag,
        "workers": options.workers,
        "concurrency": options.concurrency,
        "job": options.job,
        "ceiling_rate": max(bounded) if bounded else None,
        "first_unbounded": next((s["rate"] for s in steps if not s["bounded"]), None),
        "steps": steps,
    }


def one_rate(bench: Bench, options: Any, rate: float) -> dict[str, Any]:
    bench.reset()
    timings = Path(bench.log_dir, f"ceiling-{rate:g}")
    timings.mkdir()
    for index in range(options.workers):
        bench.spawn_worker(index, timings, pooled=False)
    bench.wait_registered(options.workers)
    dispatcher = bench.spawn_dispatcher("--rate", f"{rate:g}", "--seconds", f"{options.hold:g}")
    watch = Watch(bench.url, bench.roles())
    begun = bench.wait_started(dispatcher)
    watch.start()
    samples = follow(bench, begun, options.hold)
    ended = time.time()
    seen = watch.stop()
    sent = bench.stop(dispatcher, grace=30)
    half = begun + options.hold / 2
    done = bench.finished_between(_utc(half), _utc(ended))
    bench.stop_all()
    second = [s for s in samples if s[0] >= options.hold / 2] or samples[-1:]
    max_lag = max((lag for _, _, lag in second), default=0.0)
    growth = slope([(t, n) for t, n, _ in second])
    achieved = sent["sent"] / max(sent["seconds"], 1e-9)
    step = {
        "rate": rate,
        "sent_per_s": round(achieved, 1),
        "throughput": round(done / max(ended - half, 1e-9), 1),
        "max_lag_s": round(max_lag, 2),
        "backlog_growth_per_s": round(growth, 2),
        "bounded": max_lag <= options.max_lag
        and growth <= GROWTH * rate
        and achieved >= 0.97 * rate,
        "backlog": [(round(t, 1), n, round(lag, 2)) for t, n, lag in samples],
        "claim": claim_latency(timings, half, ended),
        "dispatcher_late_ticks": sent["late_ticks"],
        "watch": seen,
    }
    step["cores_by_group"] = groups(seen["cores_by_role"])
    step["verdict"] = verdict(step, rate)
    return step


def _utc(unix: float) -> datetime:
    return datetime.fromtimestamp(unix, UTC)


def slope(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of the backlog (jobs per second); 0 with fewer than 3 points."""
    if len(points) < 3:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_n = sum(n for _, n in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (n - mean_n) for t, n in points) / spread if spread else 0.0


def follow(bench: Bench, begun: float, seconds: float) -> list[tuple[float, int, float]]:
    """(seconds since ``begun``, backlog, oldest due job's age) every 2 s while dispatching."""
    samples = []
    while (elapsed := time.time() - begun) < seconds:
        bench.check_alive()
        count, lag = bench.backlog()
        samples.append((elapsed, count, lag))
        time.sleep(min(SAMPLE, max(seconds - elapsed, 0.01)))
    return samples


def groups(cores: dict[str, float]) -> dict[str, float]:
    """Cores used by kind of process: worker processes, their server sessions, the
    dispatcher (process and sessions), PgBouncer, each other PostgreSQL process type."""
    totals: Counter[str] = Counter()
    for role, used in cores.items():
        if role.startswith("w") and "@" in role:
            totals["worker processes"] += used
        elif role.startswith("backend:w"):
            totals["worker sessions (PostgreSQL)"] += used
        elif role.startswith("backend:dispatcher"):
            totals["dispatcher session (PostgreSQL)"] += used
        elif role.startswith("backend:"):
            totals["harness sessions (PostgreSQL)"] += used
        else:
            totals[role] += used
    return {name: round(value, 3) for name, value in totals.most_common()}


def verdict(step: dict[str, Any], rate: float) -> str:
    seen = step["watch"]
    if step["sent_per_s"] < 0.97 * rate:
        return (
            f"dispatcher: sent {step['sent_per_s']:,.0f}/s of {rate:,.0f}/s "
            f"({step['cores_by_group'].get('dispatcher', 0):.2f} cores)"
        )
    if seen["host_busy_share"] >= 0.9:
        top = ", ".join(
            f"{name} {used:.2f}" for name, used in list(step["cores_by_group"].items())[:4]
        )
        busy = seen["host_busy_share"] * (os.cpu_count() or 1)
        ours = sum(seen["cores_by_role"].values())
        return (
            f"CPU: the machine {seen['host_busy_share']:.0%} busy, {busy:.2f} cores, of which "
            f"this benchmark's processes {ours:.2f} and other programs {busy - ours:.2f} "
            f"(cores: {top})"
        )
    waits = seen["wait_shares"]
    flushes = {name: share for name, share in waits.items() if _flush_wait(name)}
    locks = sum(
        share
        for name, share in waits.items()
        if name.startswith(("Lock:", "LWLock:")) and name not in flushes
    )
    if locks >= 0.3:
        return f"locks: {locks:.0%} of active samples waited on one ({_top(waits, 'Lock')})"
    io = sum(flushes.values())
    busiest = max((disk["busy_share"] for disk in seen["disks"].values()), default=0.0)
    if io >= 0.3 or busiest >= 0.8:
        wal = seen["server_per_s"]
        return (
            f"WAL/fsync I/O: {io:.0%} of active samples waited on I/O or the WAL flush "
            f"({_top(flushes, '')}), disk "
            f"busy {busiest:.0%}, {wal.get('wal_sync_per_s', 0):,.0f} WAL syncs/s"
        )
    return (
        f"none of CPU ({seen['host_busy_share']:.0%}), locks ({locks:.0%}), I/O ({io:.0%}) "
        "saturated: the workers' threads"
    )


def _flush_wait(name: str) -> bool:
    """Whether a wait event is I/O: a read or write, or a commit waiting for the WAL flush
    (``LWLock:WALWrite`` is held by the backend writing the WAL out; the others wait for
    it: group commit, not contention on a lock)."""
    return name.startswith("IO:") or name == "LWLock:WALWrite"


def _top(waits: dict[str, float], prefix: str) -> str:
    found = [f"{name} {share:.0%}" for name, share in waits.items() if prefix in name]
    return ", ".join(found[:3]) or "none"
