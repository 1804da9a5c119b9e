"""``python -m benchmarks.raw_baseline``: what the driver and PostgreSQL allow on this
machine, next to django-gator doing the same work, in one run (A/B, alternated).

Pairs, each on the jobs table of the database at ``--database-url`` (its name must contain
``pickup`` or ``raw``: the benchmark deletes every job in it), or of a throwaway cluster
(``--cluster throwaway``: initdb into a temporary directory, its own port, autovacuum on
with the jobs table's recommended settings, benchmarks/soak/cluster.py):

- *bulk*: ``--rows`` jobs (default 100,000) with small arguments (``[i, "item-i"]``). Raw:
  psycopg ``COPY ... FROM STDIN`` with ``write_row`` of each row (its arguments through
  ``json.dumps``), one transaction. django-gator: ``dispatch_many()`` of the same argument
  lists (validation, JSON, the returned Job objects, COPY, NOTIFY).
- *single*: ``--single`` jobs one at a time. Raw: ``INSERT ... RETURNING id`` and a commit
  per job, parameters bound by the driver (psycopg prepares the statement from its fifth
  run: its default). django-gator: ``dispatch()`` in autocommit (its INSERT also NOTIFYs),
  with Django's defaults (values bound on the client, no prepared statements).
  *single-prepared*: the same with ``OPTIONS = {"server_side_binding": True,
  "prepare_threshold": 5}``, so that django-gator's INSERT is prepared as the raw one is.
  *single-autocommit*: the raw side as one ``INSERT ... RETURNING id`` per job in
  autocommit (psycopg's default transaction sends BEGIN and COMMIT as statements of their
  own: three round trips a job, where dispatch() in autocommit sends one).
  ``--synchronous-commit off`` sets it on both sides' connections for these pairs:
  without the wait for the WAL flush, which on a slow disk hides everything else.
- *drain*: ``--drain`` due no-op jobs, taken and marked done. Raw: one connection, no
  threads, no Django, ``synchronous_commit = off``: the claim statement's shape
  (``WITH picked AS (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 100) UPDATE ... RETURNING``,
  through the same partial ready index)
  then the success mark's (``UPDATE ... FROM unnest(...)`` with the compare-and-set), each
  committed, ``--batch`` (100) at a time. django-gator: one burst ``gator_worker`` in this
  process with ``--concurrency`` threads running the no-op job (``gator_bench``'s drain).
  Beside them, the *minimal* loop (benchmarks/raw_minimal.py, issue 31): a table of its own
  with only the columns a claim needs, claim ``--batch`` with ``FOR UPDATE SKIP LOCKED``,
  ack by ``UPDATE ... WHERE id = ANY(%s)``; django-gator's ratio is given to each.

Each round runs every pair on an emptied and vacuumed table, raw first in odd rounds and
django-gator first in even ones (the drain's three sides take turns going first), so that
a drift in the machine's load favours neither;
each figure is printed with its ratio to the raw one of the same round and the load
average (1 minute) when the pair started. ``--profile`` prints where django-gator's bulk
dispatch spent its time, phase by phase, in each round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks import raw_minimal

ROOT = Path(__file__).resolve().parents[1]
TABLE = "django_gator_job"
COLUMNS = (
    "id, name, args, kwargs, queue, priority, state, attempts, reserved_by, "
    "next_execution_at, chain_id, chain_position, chain, suspect, isolated, crashes, rescues"
)


RETURNED = ", ".join("j." + c.strip() for c in COLUMNS.split(","))


def arguments(count: int) -> list[list[Any]]:
    return [[i, f"item-{i}"] for i in range(count)]


# -- raw psycopg ------------------------------------------------------------------------------
def raw_copy(dsn: str, items: list[list[Any]]) -> float:
    import psycopg

    with psycopg.connect(dsn) as connection:
        started = time.perf_counter()
        now = connection.execute("SELECT statement_timestamp()").fetchone()[0]
        with (
            connection.cursor() as cursor,
            cursor.copy(
                f"COPY {TABLE} (name, args, kwargs, queue, priority, next_execution_at, "
                "created_at) FROM STDIN"
            ) as copy,
        ):
            dumps = json.dumps
            for args in items:
                copy.write_row(("raw.noop", dumps(args), "{}", "raw", 0, now, now))
        connection.commit()
        return len(items) / (time.perf_counter() - started)


def raw_single(dsn: str, count: int, synchronous_commit: str = "on") -> float:
    import psycopg

    sql = (
        f"INSERT INTO {TABLE} (name, args, kwargs, queue, priority, next_execution_at, "
        "created_at, state, attempts, rescues, last_error) VALUES (%s, %s::jsonb, %s::jsonb, "
        "%s, %s, statement_timestamp(), statement_timestamp(), 'waiting', 0, 0, '') "
        "RETURNING id"
    )
    with psycopg.connect(dsn) as connection:
        connection.execute(f"SET synchronous_commit TO {synchronous_commit}")
        connection.commit()
        started = time.perf_counter()
        for i in range(count):
            connection.execute(sql, ["raw.noop", json.dumps([i]), "{}", "raw", 0]).fetchone()
            connection.commit()
        return count / (time.perf_counter() - started)


def raw_single_autocommit(dsn: str, count: int, synchronous_commit: str = "on") -> float:
    """raw_single() as one statement per job in autocommit: no BEGIN and COMMIT round
    trips (psycopg sends each as a statement of its own), as dispatch() in autocommit
    sends it."""
    import psycopg

    sql = (
        f"INSERT INTO {TABLE} (name, args, kwargs, queue, priority, next_execution_at, "
        "created_at, state, attempts, rescues, last_error) VALUES (%s, %s::jsonb, %s::jsonb, "
        "%s, %s, statement_timestamp(), statement_timestamp(), 'waiting', 0, 0, '') "
        "RETURNING id"
    )
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"SET synchronous_commit TO {synchronous_commit}")
        started = time.perf_counter()
        for i in range(count):
            connection.execute(sql, ["raw.noop", json.dumps([i]), "{}", "raw", 0]).fetchone()
        return count / (time.perf_counter() - started)


def raw_drain(dsn: str, count: int, batch: int) -> float:
    """Claim ``batch`` due jobs and mark them succeeded, until none is left."""
    # concurrency_key IS NULL, as in django-gator's ordinary claim: the ready index
    # (gator_job_ready) is partial on it, and without it the claim cannot use that index;
    # it then sorts every waiting row on each claim, and the "raw" rate falls with the
    # backlog (that was this loop until 2026-11-24).
    claim = (
        f"WITH picked AS (SELECT id FROM {TABLE} WHERE queue = %s AND state IN "
        "('waiting', 'failed') AND concurrency_key IS NULL "
        "AND next_execution_at <= statement_timestamp() "
        "ORDER BY priority DESC, next_execution_at, id LIMIT %s FOR UPDATE SKIP LOCKED) "
        f"UPDATE {TABLE} AS j SET state = 'running', attempts = j.attempts + 1, "
        "reserved_by = %s, locked_at = statement_timestamp(), isolated = FALSE, "
        "started_at = COALESCE(j.started_at, statement_timestamp()) FROM picked "
        f"WHERE j.id = picked.id RETURNING {RETURNED}"
    )
    mark = (
        f"UPDATE {TABLE} AS j SET state = 'succeeded', finished_at = statement_timestamp(), "
        "result = u.r::jsonb FROM unnest(%s::bigint[], %s::int[], %s::text[]) AS u(id, "
        "attempts, r) WHERE j.id = u.id AND CASE WHEN j.attempts = u.attempts AND "
        "j.state = 'running' AND j.reserved_by = %s THEN true END RETURNING j.id"
    )

    def step(connection: Any) -> int | None:
        rows = connection.execute(claim, ["raw", batch, "raw-worker"]).fetchall()
        connection.commit()
        if not rows:
            return None
        ids = [row[0] for row in rows]
        attempts = [row[7] for row in rows]
        marked = connection.execute(
            mark, [ids, attempts, [None] * len(ids), "raw-worker"]
        ).fetchall()
        connection.commit()
        return len(marked)

    done, elapsed = raw_minimal.loop(dsn, step)
    if done != count:
        raise RuntimeError(f"raw drain finished {done} of {count}")
    return count / elapsed


# -- django-gator -----------------------------------------------------------------------------
def gator_bulk(items: list[list[Any]]) -> float:
    from django_gator.bench import BenchNoop

    started = time.perf_counter()
    jobs = BenchNoop.dispatch_many(items)
    elapsed = time.perf_counter() - started
    if len(jobs) != len(items) or jobs[-1].pk is None:
        raise RuntimeError("dispatch_many did not return every job")
    return len(items) / elapsed


def gator_single(count: int, synchronous_commit: str = "on", prepared: bool = False) -> float:
    """dispatch() in autocommit; ``prepared``: on a connection with Django's server-side
    binding and psycopg's prepared statements on (both off by default)."""
    from django.db import connection

    from django_gator.bench import bench_dispatch

    options = connection.settings_dict["OPTIONS"]
    saved = dict(options)
    if prepared:
        options.update(server_side_binding=True, prepare_threshold=5)
    connection.close()  # the options apply to the next connection
    connection.features.__dict__.pop("uses_server_side_binding", None)
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"SET synchronous_commit TO {synchronous_commit}")
        return bench_dispatch(count)
    finally:
        connection.close()
        connection.settings_dict["OPTIONS"] = saved
        connection.features.__dict__.pop("uses_server_side_binding", None)


def gator_drain(count: int, concurrency: int) -> float:
    from django_gator.bench import bench_drain

    return bench_drain(count, concurrency)[0]


class Phases:
    """Where django-gator's bulk dispatch spends its time: wrappers around its steps,
    installed for the run (``--profile``). "ids, COPY, NOTIFY" is the engine's time less
    the Job objects (built while PostgreSQL draws the ids) and the wait at the COPY's end
    for PostgreSQL to read what was still in the socket."""

    def __init__(self) -> None:
        import psycopg

        from django_gator import dispatch, queueable
        from django_gator.engines.postgresql import PostgresEngine

        self.spent: dict[str, float] = {}
        self._timed(queueable, "dispatch_items", "items")
        self._timed(dispatch, "_rows", "checks and JSON")
        self._timed(dispatch, "_unsaved_jobs", "Job objects (while the ids are drawn)")
        self._timed(PostgresEngine, "_copy_jobs", "ids, COPY, NOTIFY")
        self._timed(psycopg.Copy, "__exit__", "COPY's end (PostgreSQL still reading)")

    def _timed(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.spent[label] = self.spent.get(label, 0.0) + time.perf_counter() - started

        setattr(owner, name, wrapper)

    def report(self, total: float) -> str:
        spent = dict(self.spent)
        inside = spent.get("Job objects (while the ids are drawn)", 0.0)
        inside += spent.get("COPY's end (PostgreSQL still reading)", 0.0)
        if "ids, COPY, NOTIFY" in spent:
            spent["ids, COPY, NOTIFY"] -= inside
        spent["the rest (commit, tracing, signals)"] = total - sum(spent.values())
        self.spent.clear()
        return ", ".join(
            f"{label} {spent[label]:.3f} s" for label in sorted(spent, key=_step_order)
        )


def _step_order(label: str) -> int:
    steps = ["items", "checks", "ids", "Job", "COPY's end", "the rest"]
    return next(i for i, step in enumerate(steps) if label.startswith(step))


def clean(dsn: str) -> None:
    """Every job gone, the table vacuumed: each measurement starts on a clean table."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f"TRUNCATE {TABLE}")
        connection.execute(f"VACUUM ANALYZE {TABLE}")


def seed_raw(dsn: str, count: int) -> None:
    raw_copy(dsn, [[i] for i in range(count)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/gator_raw_baseline"
    )
    parser.add_argument(
        "--cluster",
        choices=["shared", "throwaway"],
        default="shared",
        help="the server at --database-url, or a throwaway cluster (its database is named "
        "as in --database-url)",
    )
    parser.add_argument("--port", type=int, default=5498, help="the throwaway cluster's port")
    parser.add_argument("--pg-bindir", default="/usr/lib/postgresql/15/bin")
    parser.add_argument(
        "--only",
        choices=["bulk", "single", "single-autocommit", "single-prepared", "drain"],
        action="append",
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--single", type=int, default=2_000)
    parser.add_argument("--synchronous-commit", choices=["on", "off"], default="on")
    parser.add_argument("--drain", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="phases of the bulk dispatch")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    url = args.database_url
    name = urlsplit(url).path.lstrip("/")
    if "raw" not in name and "pickup" not in name:
        raise SystemExit(f"its jobs are deleted: the database name must contain 'raw' ({name!r})")

    from benchmarks.soak.cluster import TABLE_AUTOVACUUM, ThrowawayCluster, end_on_sigterm

    end_on_sigterm()
    cluster = None
    if args.cluster == "throwaway":
        cluster = ThrowawayCluster(args.port, args.pg_bindir)
        url = cluster.start(name)
        print(f"throwaway cluster in {cluster.directory}, port {args.port}", flush=True)
    try:
        run(args, url, TABLE_AUTOVACUUM if cluster is not None else None)
    finally:
        if cluster is not None:
            cluster.stop()


def run(args: argparse.Namespace, url: str, table_autovacuum: dict[str, str] | None) -> None:
    dsn = url.replace("postgres://", "postgresql://", 1)

    from benchmarks.pickup.__main__ import child_env

    _create(url)
    os.environ.update(child_env(url))
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT, check=True)
    import django

    django.setup()
    from django.db import connection

    if table_autovacuum:
        options = ", ".join(f"{key} = {value}" for key, value in table_autovacuum.items())
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TABLE} SET ({options})")
    connection.ensure_connection()
    version = ".".join(map(str, connection.get_database_version()))
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        autovacuum = cursor.fetchone()[0]
    print(
        f"raw driver against django-gator: postgresql {version} (autovacuum {autovacuum}), "
        f"Django {django.get_version()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs"
    )
    only = args.only or ["bulk", "single", "single-prepared", "drain"]
    results: dict[str, list[dict[str, float]]] = {}
    phases = Phases() if args.profile else None
    sync = args.synchronous_commit

    def pair(
        label: str,
        raw: Callable[[], float],
        gator: Callable[[], float],
        rnd: int,
        count: int | None = None,
        others: dict[str, Callable[[], float]] | None = None,
    ) -> None:
        """One round of a pair (with ``others``, more baselines beside the raw one). The
        side that goes first turns from round to round (raw first in round 1). With
        ``count`` (the items each side handles) also this process's CPU time per item on
        each side: what the client spends, which a busy machine blurs less than the
        elapsed time."""
        load = os.getloadavg()[0]
        figures: dict[str, float] = {}
        cpu: dict[str, float] = {}
        sides = {"raw": raw, **(others or {}), "gator": gator}
        names = list(sides)
        shift = (rnd - 1) % len(names)
        order = names[shift:] + names[:shift]
        for side in order:
            clean(dsn)
            started = time.process_time()
            figures[side] = sides[side]()
            cpu[side] = time.process_time() - started
        r, g = figures["raw"], figures["gator"]
        entry = {**figures, "load": load}
        line = (
            f"round {rnd} {label:<40} raw {r:>10,.0f}/s  django-gator {g:>10,.0f}/s  "
            f"ratio {g / r:.2f}"
        )
        for other in others or {}:
            line += f"  {other} {figures[other]:>10,.0f}/s ratio {g / figures[other]:.2f}"
        line += f"  (load {load:.1f}, {order[0]} first)"
        if count:
            entry["raw_cpu_us"] = cpu["raw"] / count * 1e6
            entry["gator_cpu_us"] = cpu["gator"] / count * 1e6
            line += (
                f"  client CPU {entry['raw_cpu_us']:.1f} / {entry['gator_cpu_us']:.1f} us an item"
            )
        results.setdefault(label, []).append(entry)
        print(line, flush=True)

    def bulk(items: list[list[Any]]) -> float:
        if phases is not None:
            phases.spent.clear()  # the drain's dispatches went through the same steps
        rate = gator_bulk(items)
        if phases is not None:
            print(f"    bulk phases: {phases.report(len(items) / rate)}", flush=True)
        return rate

    items = arguments(args.rows)
    for rnd in range(1, args.rounds + 1):
        if "bulk" in only:
            pair(
                f"bulk {args.rows:,} rows (COPY)",
                lambda: raw_copy(dsn, items),
                lambda: bulk(items),
                rnd,
                args.rows,
            )
        if "single" in only:
            pair(
                f"single insert + commit x{args.single:,}, sync {sync}",
                lambda: raw_single(dsn, args.single, sync),
                lambda: gator_single(args.single, sync),
                rnd,
                args.single,
            )
        if "single-autocommit" in only:
            pair(
                f"single, raw in autocommit x{args.single:,}, sync {sync}",
                lambda: raw_single_autocommit(dsn, args.single, sync),
                lambda: gator_single(args.single, sync),
                rnd,
                args.single,
            )
        if "single-prepared" in only:
            pair(
                f"single, both prepared x{args.single:,}, sync {sync}",
                lambda: raw_single(dsn, args.single, sync),
                lambda: gator_single(args.single, sync, prepared=True),
                rnd,
                args.single,
            )
        if "drain" in only:

            def raw() -> float:
                seed_raw(dsn, args.drain)
                return raw_drain(dsn, args.drain, args.batch)

            def minimal() -> float:
                raw_minimal.prepare(dsn, args.drain)
                return raw_minimal.drain(dsn, args.drain, args.batch)

            pair(
                f"drain {args.drain:,} (raw batch {args.batch}, {args.concurrency} threads)",
                raw,
                lambda: gator_drain(args.drain, args.concurrency),
                rnd,
                others={"minimal": minimal},
            )
    summary: dict[str, dict[str, Any]] = {
        label: {
            "raw_per_s": [entry["raw"] for entry in rounds],
            "gator_per_s": [entry["gator"] for entry in rounds],
            "ratios": [entry["gator"] / entry["raw"] for entry in rounds],
            "load_average": [entry["load"] for entry in rounds],
            "client_cpu_us": [
                [entry["raw_cpu_us"], entry["gator_cpu_us"]]
                for entry in rounds
                if "raw_cpu_us" in entry
            ],
            "ratio_median": statistics.median(entry["gator"] / entry["raw"] for entry in rounds),
            **_minimal_summary(rounds),
        }
        for label, rounds in results.items()
    }
    for label, entry in summary.items():
        ratios = ", ".join(f"{ratio:.2f}" for ratio in entry["ratios"])
        print(f"{label:<40} ratios {ratios}; median {entry['ratio_median']:.2f}")
        if "minimal_ratios" in entry:
            ratios = ", ".join(f"{ratio:.2f}" for ratio in entry["minimal_ratios"])
            median = entry["minimal_ratio_median"]
            print(f"{label:<40} against the minimal loop: {ratios}; median {median:.2f}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


def _minimal_summary(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """The minimal loop's rates and django-gator's ratios to it (drain only)."""
    if not rounds or "minimal" not in rounds[0]:
        return {}
    ratios = [entry["gator"] / entry["minimal"] for entry in rounds]
    return {
        "minimal_per_s": [entry["minimal"] for entry in rounds],
        "minimal_ratios": ratios,
        "minimal_ratio_median": statistics.median(ratios),
    }


def _create(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    maintenance = parts._replace(path="/postgres").geturl()
    with psycopg.connect(maintenance, autocommit=True) as connection:
        if not connection.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [name]
        ).fetchone():
            connection.execute(f'CREATE DATABASE "{name}"')


if __name__ == "__main__":
    main()
