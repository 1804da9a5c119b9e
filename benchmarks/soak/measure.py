"""What the soak measures, from outside the workers: /proc, the server's statistics views,
EXPLAIN probes, and the statement timings the workers write (see app/timing.py).

PostgreSQL has it all. On MariaDB/MySQL (``--database-url mysql://...``) the jobs table's
rows, sizes and InnoDB's purge backlog (the history list, its counterpart of dead tuples),
the backlog and the oldest other transaction are read; the backends' CPU (one server
process, not one per connection), the EXPLAIN probes and pg_stat_statements are not."""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
TABLE = "django_gator_job"


# -- /proc ----------------------------------------------------------------------------------
def proc_cpu_ticks(pid: int) -> int | None:
    """utime + stime of a process, in clock ticks (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            data = stat.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def proc_status(pid: int) -> dict[str, float]:
    """RSS (MiB) and thread count of a process, from /proc/PID/status ({} once it is gone)."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    out["rss_mb"] = int(line.split()[1]) / 1024
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
    except OSError:
        return {}
    return out


def host_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def loadavg() -> float:
    with open("/proc/loadavg") as load:
        return float(load.read().split()[0])


class BackendCpu:
    """CPU time of the database backends, by role, accumulated over samples.

    Backends come and go (workers recycle their connections every
    GATOR_WORKER_CONN_MAX_AGE seconds), so each is read every few seconds and its
    increase added to its role's total; a backend that ends between two samples loses
    only what it used since the last one. Backends present at the first sample count
    from that moment; later ones from zero (they started during the run)."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[str, int]] = {}
        self.totals: Counter[str] = Counter()  # role -> ticks
        self.started = False

    def sample(self, backends: Iterable[tuple[int, str]]) -> None:
        for pid, role in backends:
            ticks = proc_cpu_ticks(pid)
            if ticks is None:
                continue
            previous = self.last.get(pid)
            if previous is None or previous[0] != role:
                base = ticks if not self.started else 0
            else:
                base = previous[1]
            self.totals[role] += max(ticks - base, 0)
            self.last[pid] = (role, ticks)
        self.started = True

    def seconds(self) -> dict[str, float]:
        return {role: ticks / CLK_TCK for role, ticks in self.totals.items()}


def postgresql(cursor: Any) -> bool:
    return bool(cursor.db.vendor == "postgresql")


def backend_roles(cursor: Any) -> list[tuple[int, str]]:
    """(pid, role) of every backend of the current database (PostgreSQL; [] elsewhere)."""
    if not postgresql(cursor):
        return []
    cursor.execute(
        "SELECT pid, application_name, backend_type FROM pg_stat_activity "
        "WHERE datname = current_database()"
    )
    roles = []
    for pid, app, backend_type in cursor.fetchall():
        if app and app.startswith("gator-soak-"):
            role = app.removeprefix("gator-soak-")
        elif backend_type == "autovacuum worker":
            role = "autovacuum"
        else:
            role = "other"
        roles.append((pid, role))
    return roles


# -- the workers' statement timings ---------------------------------------------------------
def quantile(values: list[float], q: float) -> float | None:
    """Nearest-rank quantile of a sorted list (None when empty)."""
    if not values:
        return None
    return values[max(math.ceil(q * len(values)) - 1, 0)]


def summarize(samples: list[tuple[float, int]]) -> dict[str, Any]:
    """n, p50, p99 and max in milliseconds of (microseconds, rows) samples."""
    durations = sorted(us / 1000 for us, _ in samples)
    return {
        "n": len(durations),
        "p50": _round(quantile(durations, 0.5)),
        "p99": _round(quantile(durations, 0.99)),
        "max": _round(durations[-1] if durations else None),
        "rows_mean": _round(sum(r for _, r in samples) / len(samples) if samples else None),
    }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class TimingReader:
    """Reads the timing files of app/timing.py as they grow, into per-minute buckets."""

    directory: Path
    started: float  # time.time() of minute 0
    offsets: dict[Path, int] = field(default_factory=dict)
    #: minute index -> kind -> [(microseconds, rows)]
    buckets: dict[int, dict[str, list[tuple[float, int]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    #: (time, kind, microseconds) of every sample, for windows that are not minutes.
    keep_raw: bool = False
    raw: list[tuple[float, str, float]] = field(default_factory=list)

    def read(self) -> None:
        for path in sorted(self.directory.glob("timings-*.log")):
            offset = self.offsets.get(path, 0)
            with path.open("rb") as log:
                log.seek(offset)
                data = log.read()
            end = data.rfind(b"\n") + 1
            if not end:
                continue
            self.offsets[path] = offset + end
            for line in data[:end].decode().splitlines():
                when, kind, us, rows = line.split()
                t, micro = float(when), float(us)
                if t < self.started:
                    continue
                self.buckets[int((t - self.started) // 60)][kind].append((micro, int(rows)))
                if self.keep_raw:
                    self.raw.append((t, kind, micro))

    def minute(self, index: int) -> dict[str, list[tuple[float, int]]]:
        return self.buckets.get(index, {})


def pooled(reader: TimingReader, minutes: Iterable[int], kinds: Iterable[str]) -> dict[str, Any]:
    """One summary of every sample of ``kinds`` in ``minutes``."""
    samples: list[tuple[float, int]] = []
    for index in minutes:
        bucket = reader.minute(index)
        for kind in kinds:
            samples += bucket.get(kind, [])
    return summarize(samples)


# -- the database ---------------------------------------------------------------------------
def table_stats(cursor: Any) -> dict[str, Any]:
    if not postgresql(cursor):
        return _table_stats_mysql(cursor)
    cursor.execute(
        "SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, vacuum_count, "
        "autovacuum_count, last_autovacuum, autoanalyze_count FROM pg_stat_user_tables "
        "WHERE relname = %s",
        [TABLE],
    )
    row = cursor.fetchone()
    names = [
        "n_live_tup",
        "n_dead_tup",
        "n_tup_upd",
        "n_tup_hot_upd",
        "vacuum_count",
        "autovacuum_count",
        "last_autovacuum",
        "autoanalyze_count",
    ]
    stats: dict[str, Any] = dict(zip(names, row, strict=True)) if row else {}
    if stats.get("last_autovacuum") is not None:
        stats["last_autovacuum"] = stats["last_autovacuum"].isoformat()
    stats.update(_rows(cursor))
    cursor.execute(
        "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c WHERE c.oid = %s::regclass "
        "OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass)",
        [TABLE, TABLE],
    )
    sizes = {name: round(size / 2**20, 2) for name, size in cursor.fetchall()}
    stats["table_mb"] = sizes.pop(TABLE, None)
    stats["index_mb"] = sizes
    return stats


def _rows(cursor: Any) -> dict[str, Any]:
    """The jobs table's rows, by state and in all."""
    cursor.execute("SELECT state, count(*) FROM django_gator_job GROUP BY state")
    by_state = dict(cursor.fetchall())
    return {"by_state": by_state, "rows": sum(by_state.values())}


def _table_stats_mysql(cursor: Any) -> dict[str, Any]:
    """Rows by state, sizes, and InnoDB's history list length: the undo records purge has
    not removed yet (MariaDB's counterpart of dead tuples), in ``n_dead_tup``'s place."""
    stats: dict[str, Any] = _rows(cursor)
    cursor.execute(
        "SELECT data_length, index_length FROM information_schema.TABLES "
        "WHERE table_schema = DATABASE() AND table_name = %s",
        [TABLE],
    )
    row = cursor.fetchone()
    if row:
        stats["table_mb"] = round(row[0] / 2**20, 2)
        stats["index_mb"] = {"all": round(row[1] / 2**20, 2)}
    cursor.execute(
        "SELECT count FROM information_schema.INNODB_METRICS WHERE name = 'trx_rseg_history_len'"
    )
    row = cursor.fetchone()
    stats["history_list_length"] = int(row[0]) if row else None
    return stats


def backlog(cursor: Any) -> tuple[int, float]:
    """(jobs due and waiting, age in seconds of the oldest of them)."""
    if postgresql(cursor):
        now = "statement_timestamp()"
        age = f"EXTRACT(EPOCH FROM {now} - min(next_execution_at))"
    else:
        now = "UTC_TIMESTAMP(6)"
        age = f"TIMESTAMPDIFF(MICROSECOND, min(next_execution_at), {now}) / 1e6"
    cursor.execute(
        f"SELECT count(*), {age} FROM django_gator_job WHERE state IN ('waiting', 'failed') "
        f"AND next_execution_at <= {now}"
    )
    count, age = cursor.fetchone()
    return int(count), float(age or 0.0)


def horizon(cursor: Any) -> dict[str, Any]:
    """The oldest transaction on the whole server that holds back cleanup (an xid or a
    snapshot), other than the soak's own short ones: while it is open, no dead row or
    index entry newer than it can be removed, in any database. (MariaDB: the oldest InnoDB
    transaction, which holds back purge the same way.)"""
    if not postgresql(cursor):
        cursor.execute(
            "SELECT TIMESTAMPDIFF(MICROSECOND, min(trx_started), NOW(6)) / 1e6 "
            "FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id <> CONNECTION_ID()"
        )
        row = cursor.fetchone()
        return {"oldest_xact_s": round(float(row[0] or 0.0), 1) if row else 0.0}
    cursor.execute(
        "SELECT datname, state, EXTRACT(EPOCH FROM now() - xact_start), "
        "greatest(age(backend_xid), age(backend_xmin)) FROM pg_stat_activity "
        "WHERE (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) AND pid <> pg_backend_pid() "
        "AND coalesce(application_name, '') NOT IN ('gator-soak-worker', 'gator-soak-harness') "
        "ORDER BY xact_start LIMIT 1"
    )
    row = cursor.fetchone()
    if row is None:
        return {"oldest_xact_s": 0.0}
    datname, state, age_s, xids = row
    return {
        "oldest_xact_s": round(float(age_s or 0.0), 1),
        "database": datname,
        "state": state,
        "xid_age": xids,
    }


def finished_between(cursor: Any, start: Any, end: Any) -> dict[str, int]:
    cursor.execute(
        "SELECT state, count(*) FROM django_gator_job WHERE state IN ('succeeded', 'dead', "
        "'cancelled') AND finished_at >= %s AND finished_at < %s GROUP BY state",
        [start, end],
    )
    return dict(cursor.fetchall())


def succeeded_total(cursor: Any) -> int:
    """Jobs succeeded so far: those in the table and those the pruner deleted."""
    cursor.execute(
        "SELECT (SELECT count(*) FROM django_gator_job WHERE state = 'succeeded') + "
        "COALESCE((SELECT sum(count) FROM gator_soak_deletedjobs WHERE state = 'succeeded'), 0)"
    )
    return int(cursor.fetchone()[0])


def pgss_kind(query: str) -> str | None:
    """The kind of a pg_stat_statements entry (constants there are $n placeholders)."""
    if query.startswith("WITH picked AS"):
        return "claim_keyset" if "(next_execution_at, id) >" in query else "claim"
    if query.startswith("UPDATE") and "result =" in query:
        return "mark"
    if query.startswith("UPDATE") and "rescues = rescues +" in query:
        return "rescue"
    if query.startswith("UPDATE") and "errors =" in query:
        return "fail"
    if query.startswith("WITH RECURSIVE q(queue)"):
        return "queues"
    return None


def pgss_snapshot(cursor: Any) -> dict[str, tuple[int, float, int]]:
    """kind -> (calls, total execution ms, shared buffers hit + read), summed."""
    cursor.execute(
        "SELECT query, calls, total_exec_time, shared_blks_hit + shared_blks_read "
        "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database "
        "WHERE datname = current_database())"
    )
    out: dict[str, tuple[int, float, int]] = {}
    for query, calls, total, blocks in cursor.fetchall():
        kind = pgss_kind(query)
        if kind is None:
            continue
        c, t, b = out.get(kind, (0, 0.0, 0))
        out[kind] = (c + calls, t + total, b + blocks)
    return out


def pgss_delta(
    before: dict[str, tuple[int, float, int]], after: dict[str, tuple[int, float, int]]
) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for kind, (calls, total, blocks) in after.items():
        c0, t0, b0 = before.get(kind, (0, 0.0, 0))
        n = calls - c0
        out[kind] = {
            "calls": n,
            "total_ms": round(total - t0, 1),
            "mean_ms": round((total - t0) / n, 4) if n else None,
            "buffers_per_call": round((blocks - b0) / n, 1) if n else None,
        }
    return out


Statements = dict[int, tuple[str, int, float, int, float]]


def pgss_statements(cursor: Any) -> Statements:
    """Every statement of the database in pg_stat_statements, by queryid: (its text, calls,
    total execution ms, shared buffers hit + read, total planning ms: the throwaway
    cluster tracks planning, see cluster.CLUSTER_SETTINGS)."""
    cursor.execute(
        "SELECT queryid, query, calls, total_exec_time, shared_blks_hit + shared_blks_read, "
        "total_plan_time FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database "
        "WHERE datname = current_database())"
    )
    return {
        int(queryid): (query, int(calls), float(total), int(blocks), float(plan))
        for queryid, query, calls, total, blocks, plan in cursor.fetchall()
    }


def planning_ms(before: Statements, after: Statements) -> float:
    """The server's planning time, in ms, of every statement between two snapshots."""
    return sum(row[4] - (before[q][4] if q in before else 0.0) for q, row in after.items())


def pgss_top(
    before: Statements,
    after: Statements,
    jobs: int,
    count: int = 12,
    by: str = "buffers",
) -> list[dict[str, Any]]:
    """The ``count`` statements that read the most shared buffers (``by="ms"``: that took
    the most execution time) between two :func:`pgss_statements` snapshots, per job done
    meanwhile: which statement a window's growth, or a minute's cost, comes from, whatever
    its kind (the limited claim's statements, the gauges, the ledger have no kind of their
    own in :func:`pgss_kind`)."""
    rows = []
    for queryid, (query, calls, total, blocks, plan) in after.items():
        _, c0, t0, b0, p0 = before.get(queryid, (query, 0, 0.0, 0, 0.0))
        if calls == c0:
            continue
        rows.append(
            {
                "queryid": queryid,
                "query": " ".join(query.split())[:200],
                "calls": calls - c0,
                "buffers": blocks - b0,
                "buffers_per_call": round((blocks - b0) / (calls - c0), 1),
                "buffers_per_job": round((blocks - b0) / jobs, 2) if jobs else None,
                "ms_per_job": round((total - t0) / jobs, 4) if jobs else None,
                "ms": round(total - t0, 1),
                "plan_ms": round(plan - p0, 1),  # planning, apart from the execution
            }
        )
    rows.sort(key=lambda row: row[by], reverse=True)
    return rows[:count]


# -- EXPLAIN probes -------------------------------------------------------------------------
class _Explained(Exception):
    """Raised by the probe's wrapper once it has the plan, to roll back and stop."""


def explain(connection: Any, action: Callable[[], object], text: bool = False) -> dict[str, Any]:
    """Run ``action`` (a call into the engine) with its first statement replaced by
    EXPLAIN (ANALYZE, BUFFERS) of that statement, in a transaction that is rolled back;
    returns the plan's execution time, buffers and the indexes it scanned (and, with
    ``text``, the plan as EXPLAIN prints it)."""
    from django.db import DatabaseError, transaction

    from django_gator.engines.partition_moves import MOVE_TRIES, moved

    captured: dict[str, Any] = {}

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        cursor = context["cursor"]
        execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params, many, context)
        captured["plan"] = cursor.fetchone()[0]
        if text:
            execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params, many, context)
            captured["text"] = "\n".join(row[0] for row in cursor.fetchall())
        raise _Explained

    for attempt in range(1, MOVE_TRIES + 1):
        try:
            with transaction.atomic(), connection.execute_wrapper(wrapper):
                action()
        except _Explained:
            break
        except DatabaseError as exc:
            # On partitioned storage, EXPLAIN ANALYZE of a locking claim refuses a row that
            # a worker moved to another partition meanwhile, as the claim itself does (the
            # engine runs the claim again: engines/partition_moves.py); so does the probe.
            if not moved(exc) or attempt == MOVE_TRIES:
                raise
    [document] = captured["plan"]
    plan = document["Plan"]
    result = {
        "ms": round(document["Execution Time"], 4),
        "buffers": plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0),
        "scans": sorted(set(_scans(plan))),
    }
    if text:
        result["text"] = captured["text"]
    return result


def _scans(node: dict[str, Any]) -> Iterable[str]:
    if "Scan" in node["Node Type"]:
        yield f"{node['Node Type']} {node.get('Index Name') or node.get('Relation Name', '')}"
    for child in node.get("Plans", []):
        yield from _scans(child)


def probe_claim(connection: Any, engine: Any, queue: str, text: bool = False) -> dict[str, Any]:
    """The worker's full claim (the one not helped by a keyset) for one job, rolled back."""
    return explain(connection, lambda: engine.claim("gator-soak-probe", queue, 1), text)


def probe_queues(connection: Any, engine: Any, text: bool = False) -> dict[str, Any]:
    """The list of queues with ready jobs (a worker without -q runs it before claims)."""
    return explain(connection, engine.ready_queues, text)


def probe_mark(
    connection: Any, engine: Any, batch: int = 8, text: bool = False
) -> dict[str, Any] | None:
    """The worker's success mark on its ``batch`` most recently finished jobs (already
    succeeded, so the compare-and-set matches nothing and nothing is written): the cost of
    finding the rows, which is what grew in issue 15. ``batch`` 1 is the single-job
    statement, more the batched one."""
    from django_gator.attempts import Mark

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, attempts, reserved_by FROM django_gator_job WHERE state = 'succeeded' "
            "ORDER BY id DESC LIMIT %s",
            [batch * 4],
        )
        rows = cursor.fetchall()
    if not rows:
        return None
    owner = rows[0][2]
    done = [Mark(job_id, attempts) for job_id, attempts, by in rows if by == owner][:batch]
    if len(done) < batch:
        return None
    return explain(connection, lambda: engine.mark_succeeded(owner, done), text)
