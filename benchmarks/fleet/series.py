"""The fleet curve: throughput and claim latency against the number of worker processes,
spread over the network hosts, directly and through PgBouncer.

Each step starts from an emptied, vacuumed jobs table; the dispatcher (on the database's
host) keeps ``--backlog`` jobs waiting all through it, so the workers never run dry; then
``P`` worker processes start, worker ``i`` on host ``i mod hosts`` (``--concurrency``
threads each), and after ``--warmup`` seconds the step measures for ``--step`` seconds:

- throughput: jobs that succeeded in the window (their finished_at, the server's clock);
- claim p50/p99: the claim statements the workers timed themselves in the window (the
  soak's execute wrapper, benchmarks/soak/app/timing.py);
- connections per worker process: its server sessions (pg_stat_activity by
  application_name and client address, the largest count seen), apart its LISTEN session;
  through PgBouncer, its client connections (SHOW CLIENTS) and PgBouncer's server sessions
  (from 127.0.0.1: the pool, shared by all);
- CPU by kind of process and the machine's busy share (observe.py).

Checks: no step's throughput more than ``--max-fall`` (10 %) below the best step with
fewer processes (no contention collapse as processes are added past the CPUs), and every
step's claim p99 under ``--claim-p99-max`` ms.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.fleet.ceiling import groups
from benchmarks.fleet.observe import Watch
from benchmarks.fleet.runner import Bench, claim_latency


def run(bench: Bench, options: Any, pooled: bool) -> dict[str, Any]:
    label = "pgbouncer" if pooled else "direct"
    if options.worker == "raw":
        label = "direct, control (rawworker)"
    if pooled:
        bench.start_bouncer()
    steps = []
    try:
        for count in options.processes:
            step = one_count(bench, options, count, pooled)
            steps.append(step)
            print(
                f"  {label} {count:>2} processes: {step['throughput']:,.0f} jobs/s, claim p50 "
                f"{step['claim']['p50_ms']} p99 {step['claim']['p99_ms']} ms, server sessions "
                f"per process {step['connections']['server_per_process']}, machine "
                f"{step['watch']['host_busy_share']:.0%} busy (this benchmark "
                f"{sum(step['cores_by_group'].values()):.2f} cores)",
                flush=True,
            )
    finally:
        if pooled:
            bench.stop_bouncer()
    return {"mode": label, "steps": steps, "checks": checks(steps, options)}


def one_count(bench: Bench, options: Any, count: int, pooled: bool) -> dict[str, Any]:
    bench.reset()
    timings = Path(bench.log_dir, f"{'pooled' if pooled else 'direct'}-{count}")
    timings.mkdir()
    dispatcher = bench.spawn_dispatcher("--backlog", str(options.backlog))
    deadline = time.monotonic() + 60
    while bench.backlog()[0] < options.backlog * 0.9 and time.monotonic() < deadline:
        bench.check_alive()
        time.sleep(0.2)
    workers = [bench.spawn_worker(index, timings, pooled) for index in range(count)]
    bench.wait_registered(count)
    time.sleep(options.warmup)
    watch = Watch(bench.url, bench.roles())
    watch.start()
    started, server_start = time.time(), bench.server_now()
    while time.time() - started < options.step:
        bench.check_alive()
        time.sleep(min(1.0, max(options.step - (time.time() - started), 0.01)))
    clients = bench.pgbouncer.clients() if bench.pgbouncer else []
    ended, server_end = time.time(), bench.server_now()
    seen = watch.stop()
    done = bench.finished_between(server_start, server_end)
    for pid in workers:
        bench.stop(pid)
    bench.stop(dispatcher)
    return {
        "processes": count,
        "hosts": sorted({f"h{index % len(bench.network.hosts) + 1}" for index in range(count)})
        if bench.network
        else ["db"],
        "throughput": round(done / max(ended - started, 1e-9), 1),
        "claim": claim_latency(timings, started, ended),
        "connections": connections(seen, clients, count),
        "cores_by_group": groups(seen["cores_by_role"]),
        "watch": seen,
    }


def connections(seen: dict[str, Any], clients: list[dict[str, str]], count: int) -> dict[str, Any]:
    """Server sessions per worker process (the largest count seen; its LISTEN session apart)
    and,
    through PgBouncer, client connections per process."""
    sessions: dict[str, int] = seen["sessions"]
    server: Counter[str] = Counter()
    listen: Counter[str] = Counter()
    for key, n in sessions.items():
        app, client = key.rsplit("@", 1)  # "w3@h2-listen@10.231.2.2"
        if not (app.startswith("w") and "@" in app):
            continue
        if app.endswith("-listen"):
            listen[app.removesuffix("-listen")] += n
        elif not (clients and client == "127.0.0.1"):  # not PgBouncer's (named by turns)
            server[app] += n
    by_client: Counter[str] = Counter()
    for client in clients:
        app = client.get("application_name", "").removeprefix("gator-fleet-")
        if app.startswith("w") and "@" in app:
            by_client[app] += 1
    return {
        "server_per_process": _spread(list(server.values())),
        "listen_per_process": _spread(list(listen.values())),
        # PgBouncer's server sessions for the workers (from 127.0.0.1), the largest count.
        "pgbouncer_server_sessions": seen["worker_sessions_by_client"].get("127.0.0.1")
        if clients
        else None,
        "pgbouncer_clients_per_process": _spread(list(by_client.values())) if clients else None,
        "pgbouncer_clients_total": len(clients) if clients else None,
        "by_session": sessions,
        "processes": count,
    }


def _spread(values: list[int]) -> dict[str, float] | None:
    if not values:
        return None
    return {"min": min(values), "max": max(values), "mean": round(sum(values) / len(values), 2)}


def checks(steps: list[dict[str, Any]], options: Any) -> list[dict[str, Any]]:
    found = []
    for index, step in enumerate(steps):
        before = [s["throughput"] for s in steps[:index]]
        if before and step["throughput"] < (1 - options.max_fall) * max(before):
            found.append(
                {
                    "check": "throughput fell",
                    "processes": step["processes"],
                    "detail": f"{step['throughput']:,.0f} jobs/s against {max(before):,.0f} with "
                    f"fewer processes ({1 - step['throughput'] / max(before):.0%} less)",
                }
            )
        p99 = step["claim"]["p99_ms"]
        if p99 is None or p99 > options.claim_p99_max:
            found.append(
                {
                    "check": "claim p99",
                    "processes": step["processes"],
                    "detail": f"{p99} ms against the bound {options.claim_p99_max:g} ms",
                }
            )
    return found
