"""Issue 32's "a day's load in an hour": what ``--web`` and ``--partitioning`` add to the soak.

- :func:`storage`: the jobs table's size, dead tuples and vacuums summed over its
  partitions (a plain table is its own only leaf), with the hot part (the active, dead and
  default partitions; the whole of a plain table) apart;
- :class:`PartitionLedger`: counts each time partition by job name and state once it is
  closed (its end a minute past), so that the jobs its drop removes still count in the
  outcome check, and records each drop;
- :func:`cluster_cpu`: CPU seconds of a whole PostgreSQL cluster (its postmaster, every
  child alive, and those it reaped: autovacuum workers, the checkpointer, WAL writer);
- the checks that fail the run (pure functions of the per-minute records and the ledger,
  tested without a database in tests/test_soak_day.py): every web-dispatched job ran to
  success once and none ran twice outside a rescue, none rolled back ran, the backlog
  stayed bounded, claim p99 and size did not grow by more than ``limit`` (1.3x) from the
  first ten minutes after the first retention window to the last ten, partitions were
  dropped once past their retention.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.soak.features import Check

TABLE = "django_gator_job"
#: Partitions of the hot part (the others are the finished jobs' time partitions).
HOT = (f"{TABLE}_active", f"{TABLE}_dead", f"{TABLE}_done_default", TABLE)
#: The part of the hot part that claims and marks read: the hot part but the dead jobs'
#: partition, which grows with every job that ends dead (kept until an operator retries or
#: prunes it, on either storage) and is judged per dead job instead (check_dead_partition).
CLAIMED = (f"{TABLE}_active", f"{TABLE}_done_default", TABLE)
DEAD = f"{TABLE}_dead"
PARTITION_SECONDS = {"none": 0, "day": 86400, "hour": 3600}
#: The backlog is bounded while nothing due waits longer than this, and no more jobs are
#: due than the rate makes in this many seconds.
BACKLOG_SECONDS = 60.0
GROWTH_LIMIT = 1.3
#: The jobs table's leaves: its partitions' (pg_partition_tree returns nothing for a plain
#: table), or the plain table itself. Two parameters: the table's name, twice.
LEAVES = (
    "SELECT relid FROM pg_partition_tree(%s::regclass) WHERE isleaf "
    "UNION ALL SELECT c.oid FROM pg_class c WHERE c.oid = %s::regclass AND c.relkind = 'r'"
)


# -- measuring -----------------------------------------------------------------------------
@dataclass
class VacuumCounts:
    """Autovacuum runs per partition, kept after a partition is dropped (the sum over the
    live partitions would go down at each drop)."""

    seen: dict[str, tuple[int, int]] = field(default_factory=dict)

    def update(self, name: str, autovacuum: int, vacuum: int) -> None:
        self.seen[name] = (autovacuum, vacuum)

    def totals(self) -> tuple[int, int]:
        return (
            sum(a for a, _ in self.seen.values()),
            sum(v for _, v in self.seen.values()),
        )


def storage(cursor: Any, vacuums: VacuumCounts) -> dict[str, Any]:
    """Sizes (MiB), tuples and vacuums of the jobs table, summed over its leaves."""
    cursor.execute(
        "SELECT c.relname, coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0), "
        "coalesce(s.autovacuum_count, 0), coalesce(s.vacuum_count, 0), "
        "pg_relation_size(c.oid), pg_indexes_size(c.oid), pg_total_relation_size(c.oid) "
        f"FROM ({LEAVES}) t JOIN pg_class c ON c.oid = t.relid "
        "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid",
        [TABLE, TABLE],
    )
    heap = index = total = hot = claimed = dead_part = 0
    live = dead = leaves = 0
    for name, n_live, n_dead, autovacuum, vacuum, rel, idx, tot in cursor.fetchall():
        vacuums.update(name, int(autovacuum), int(vacuum))
        heap, index, total = heap + rel, index + idx, total + tot
        hot += tot if name in HOT else 0
        claimed += tot if name in CLAIMED else 0
        dead_part += tot if name == DEAD else 0
        live, dead, leaves = live + int(n_live), dead + int(n_dead), leaves + 1
    autovacuum_total, vacuum_total = vacuums.totals()
    mib = 2**20
    return {
        "total_mb": round(total / mib, 2),
        "heap_mb": round(heap / mib, 2),
        "index_mb": round(index / mib, 2),
        "hot_mb": round(hot / mib, 2),
        "claimed_mb": round(claimed / mib, 2),
        "dead_partition_mb": round(dead_part / mib, 2),
        "n_live_tup": live,
        "n_dead_tup": dead,
        "autovacuum_runs": autovacuum_total,
        "vacuum_runs": vacuum_total,
        "leaves": leaves,
    }


def free_backlog(cursor: Any) -> tuple[int, float]:
    """(jobs due and waiting, age in seconds of the oldest of them), leaving out the jobs a
    flow limit holds on purpose (a concurrency key, the soak's limited queue): those wait
    for their key's or queue's turn however fast the workers are."""
    cursor.execute(
        "SELECT count(*), EXTRACT(EPOCH FROM statement_timestamp() - min(next_execution_at)) "
        "FROM django_gator_job WHERE state IN ('waiting', 'failed') AND next_execution_at <= "
        "statement_timestamp() AND concurrency_key IS NULL AND queue <> 'soak-limited'"
    )
    count, age = cursor.fetchone()
    return int(count), float(age or 0.0)


def postmaster_pid(data: Path) -> int | None:
    try:
        return int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cluster_cpu(postmaster: int) -> float | None:
    """CPU seconds of a PostgreSQL cluster so far: the postmaster's own and its reaped
    children's (cutime, cstime), plus each live child's."""
    ticks = os.sysconf("SC_CLK_TCK")
    own = _stat(postmaster)
    if own is None:
        return None
    total = sum(int(v) for v in own[11:15])  # utime stime cutime cstime
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[1] == str(postmaster):
                total += int(fields[11]) + int(fields[12])
    return total / ticks


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state is [0], ppid [1])."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


@dataclass
class PartitionLedger:
    """Counts closed time partitions by (job name, state) and notices their drops."""

    #: Seconds after its end a partition is counted (a mark's transaction that began
    #: before the end may still be committing rows into it).
    margin: float = 15.0
    counted: dict[str, dict[str, Any]] = field(default_factory=dict)
    present: set[str] = field(default_factory=set)
    drops: list[dict[str, Any]] = field(default_factory=list)

    def sample(self, cursor: Any, partitions: list[Any], now: datetime) -> dict[str, Any]:
        names = {p.name for p in partitions}
        for name in sorted(self.present - names):
            record = self.counted.get(name)
            self.drops.append(
                {
                    "partition": name,
                    "noticed": now.isoformat(timespec="seconds"),
                    "rows": sum(record["counts"].values()) if record else None,
                    "counted": record is not None,
                }
            )
        self.present = names
        for p in partitions:
            if p.name not in self.counted and (now - p.end).total_seconds() >= self.margin:
                cursor.execute(f'SELECT name, state, count(*) FROM "{p.name}" GROUP BY 1, 2')
                self.counted[p.name] = {
                    "start": p.start.isoformat(),
                    "end": p.end.isoformat(),
                    "counts": {f"{n}|{s}": int(c) for n, s, c in cursor.fetchall()},
                }
        return {
            "time_partitions": len(partitions),
            "drops": len(self.drops),
            "oldest": min((p.start for p in partitions), default=None),
        }

    def dropped_counts(self) -> Counter[tuple[str, str]]:
        """(job name, state) -> rows in the dropped partitions."""
        out: Counter[tuple[str, str]] = Counter()
        for drop in self.drops:
            record = self.counted.get(drop["partition"])
            for key, n in (record or {"counts": {}})["counts"].items():
                name, _, state = key.partition("|")
                out[(name, state)] += n
        return out


def add_dropped(counts: dict[str, Any], dropped: Counter[tuple[str, str]]) -> None:
    """Count the rows of dropped partitions as deleted (features.outcome_counts' shape)."""
    for (name, state), n in dropped.items():
        entry = counts.setdefault(name, {"live": {}, "deleted": {}})
        entry["deleted"][state] = entry["deleted"].get(state, 0) + n


# -- the checks ----------------------------------------------------------------------------
def check_ledger(
    dispatched: list[str], rolledback: list[str], runs: list[list[str]], rescues: int
) -> Check:
    """Every committed token ran to success exactly once; an attempt ran twice, or a token
    succeeded twice, only as many times as rescues happened; no rolled-back or unknown
    token ran."""
    committed = set(dispatched)
    successes: Counter[str] = Counter(t for t, _, outcome in runs if outcome == "ok")
    attempts: Counter[tuple[str, str]] = Counter((t, a) for t, a, _ in runs)
    lost = sorted(committed - set(successes))
    twice = sorted(
        {t for t, n in successes.items() if n > 1} | {t for (t, _), n in attempts.items() if n > 1}
    )
    ghosts = sorted({t for t, _, _ in runs} - committed)
    repeated = len(dispatched) - len(committed)
    ok = bool(committed) and not lost and len(twice) <= rescues and not ghosts and not repeated
    detail = (
        f"{len(committed)} jobs dispatched and committed by the web-like processes, "
        f"{len(rolledback)} rolled back; {len(runs)} runs: lost {len(lost)}, run twice "
        f"{len(twice)} (rescues seen: {rescues}), ran without a committed dispatch "
        f"{len(ghosts)} (of them rolled back: {len(set(ghosts) & set(rolledback))})"
    )
    if repeated:
        detail += f"; {repeated} tokens dispatched twice (a harness error)"
    for what, items in (("lost", lost), ("twice", twice), ("ghosts", ghosts)):
        if items:
            detail += f"; {what}: {items[:10]}"
    return Check("web-dispatched jobs: none lost, none run twice, none rolled back run", ok, detail)


def judged_windows(
    minutes: list[dict[str, Any]], warmup_s: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first and last ten full minutes (fewer in a short run: half of those judged each)
    after the first ``warmup_s`` seconds (the first retention window and a pruning pass)."""
    full = [m for m in minutes if not m.get("partial")]
    judged = [m for m in full if m["minute"] > math.ceil(warmup_s / 60)]
    span = min(10, len(judged) // 2)
    if span == 0:
        return [], []
    return judged[:span], judged[-span:]


def _median(values: list[float]) -> float | None:
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def check_growth(
    minutes: list[dict[str, Any]],
    warmup_s: float,
    claim_p99: tuple[float | None, float | None],
    size_key: str,
    limit: float = GROWTH_LIMIT,
) -> list[Check]:
    """Claim p99 (pooled over each window, as the harness computes it: ``claim_p99``) and
    the median of ``size_key`` (MiB of storage per minute) in the last window at most
    ``limit`` times the first's."""
    first, last = judged_windows(minutes, warmup_s)
    if not first:
        reason = f"run too short: no two windows after the first {warmup_s:g} s"
        return [Check(f"claim p99 and {size_key} within x{limit:g}", False, reason)]
    window = (
        f"minutes {first[0]['minute']}-{first[-1]['minute']} vs "
        f"{last[0]['minute']}-{last[-1]['minute']}"
    )
    s0 = _median([m["storage"][size_key] for m in first])
    s1 = _median([m["storage"][size_key] for m in last])
    return [
        _growth(f"claim p99 last window <= x{limit:g}", window, claim_p99, "ms", limit),
        _growth(f"jobs table {size_key} last window <= x{limit:g}", window, (s0, s1), "MiB", limit),
    ]


def check_dead_partition(
    minutes: list[dict[str, Any]], warmup_s: float, limit: float = GROWTH_LIMIT
) -> Check:
    """Partitioned storage: the dead jobs' partition grows with the jobs that end dead (kept
    until an operator retries or prunes them: growth by design, not bloat), so its size is
    judged per dead job: the last window's KiB per dead job at most ``limit`` times the
    first's."""
    first, last = judged_windows(minutes, warmup_s)
    name = f"dead jobs' partition, KiB per dead job, last window <= x{limit:g}"
    if not first or "dead_partition_mb" not in first[0]["storage"]:
        return Check(name, False, "run too short, or sizes without the dead partition's")

    def per_job(window: list[dict[str, Any]]) -> float | None:
        sizes = [
            m["storage"]["dead_partition_mb"] * 1024 / m["table"]["by_state"]["dead"]
            for m in window
            if m["table"]["by_state"].get("dead")
        ]
        return _median(sizes)

    a, b = per_job(first), per_job(last)
    if a is None and b is None:
        return Check(f"{name} the first after retention", True, "no dead jobs in either window")
    ratio = round(b / a, 2) if a and b is not None else None
    mb = (first[0]["storage"]["dead_partition_mb"], last[-1]["storage"]["dead_partition_mb"])
    jobs = (first[0]["table"]["by_state"].get("dead"), last[-1]["table"]["by_state"].get("dead"))
    return Check(
        f"{name} the first after retention",
        ratio is not None and ratio <= limit,
        f"minutes {first[0]['minute']}-{first[-1]['minute']} vs "
        f"{last[0]['minute']}-{last[-1]['minute']}: {a and round(a, 2)} -> "
        f"{b and round(b, 2)} KiB (x{ratio}); {mb[0]} MiB for {jobs[0]} dead jobs at minute "
        f"{first[0]['minute']}, {mb[1]} MiB for {jobs[1]} at minute {last[-1]['minute']}",
    )


def _growth(
    name: str, window: str, values: tuple[float | None, float | None], unit: str, limit: float
) -> Check:
    a, b = values
    ratio = round(b / a, 2) if a and b is not None else None
    return Check(
        f"{name} the first after retention",
        ratio is not None and ratio <= limit,
        f"{window}: {a} -> {b} {unit} (x{ratio})",
    )


def check_offered(offered: int, rate: float, seconds: float, share: float = 0.95) -> Check:
    """The web processes dispatched their part of the rate (at least ``share`` of it): a
    machine too slow to dispatch would otherwise pass every other check at a lower rate."""
    want = rate * seconds
    return Check(
        "web processes dispatched their rate",
        offered >= share * want,
        f"{offered} jobs dispatched of {want:.0f} due ({rate:g}/s for {seconds:g} s): "
        f"{offered / want:.1%}" + ("" if offered >= share * want else f", under {share:.0%}"),
    )


def check_backlog(minutes: list[dict[str, Any]], rate: float) -> Check:
    """From the second full minute on: never more jobs due than ``BACKLOG_SECONDS`` of the
    rate, and never one due for longer than that."""
    judged = [m for m in minutes if not m.get("partial") and m["minute"] >= 2]
    bound = rate * BACKLOG_SECONDS
    # Without the flow-limited jobs when the run measured it (free_backlog).
    backlogs = [(m["minute"], m.get("free_backlog") or m["backlog"]) for m in judged]
    due = max((b["due_max"] for _, b in backlogs), default=0)
    oldest = max((b["oldest_s_max"] for _, b in backlogs), default=0.0)
    bad = [
        minute
        for minute, b in backlogs
        if b["due_max"] > bound or b["oldest_s_max"] > BACKLOG_SECONDS
    ]
    return Check(
        "backlog bounded (jobs not held by a flow limit)",
        bool(judged) and not bad,
        f"jobs due at most {due} (bound: {BACKLOG_SECONDS:g} s of the rate = {bound:.0f}), "
        f"oldest due job at most {oldest} s (bound {BACKLOG_SECONDS:g} s); minutes over: "
        f"{bad or 'none'}",
    )


def check_drops(
    ledger: PartitionLedger, retention_s: float, interval_s: float, at: datetime
) -> Check:
    """Every time partition whose end is older than retention + two pruning passes + a
    minute was dropped by ``at``, and each dropped one was counted before."""
    late = [
        name
        for name, record in ledger.counted.items()
        if name in ledger.present
        and (at - datetime.fromisoformat(record["end"])).total_seconds()
        > retention_s + 2 * interval_s + 60
    ]
    uncounted = [d["partition"] for d in ledger.drops if not d["counted"]]
    return Check(
        "time partitions dropped once past retention (and counted before)",
        not late and not uncounted,
        f"{len(ledger.drops)} dropped ({', '.join(d['partition'] for d in ledger.drops) or '-'}; "
        f"{sum(d['rows'] or 0 for d in ledger.drops)} rows); overdue and still there: "
        f"{late or 'none'}; dropped before the ledger counted them: {uncounted or 'none'}",
    )
