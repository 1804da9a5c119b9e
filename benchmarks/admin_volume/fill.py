"""The admin-at-volume benchmark's table: ``rows`` jobs in the mix a day's soak leaves, bulk
loaded with INSERT ... SELECT over generate_series (500,000 rows a statement), plus the
batches, workflows and the superuser the pages need."""

from __future__ import annotations

import time
from typing import Any

#: Shares of the finished rows by state, per mille.
SHARES = (
    ("succeeded", 980),
    ("cancelled", 10),
    ("dead", 10),
)
#: The unfinished rows, a number each rather than a share: what a day's soak leaves at any
#: moment does not grow with the table's history. Ten times what the soak's validation hour
#: left at 120 jobs/s (278 waiting, 29 failed, 21 running; docs/benchmarks.md), for the
#: day's rate: 2,000 due, 1,000 scheduled (the web's delayed dispatches and snoozes), 300
#: failed and due to retry, 100 running (the fleet's executor slots). ``backlog`` adds due
#: jobs: the state after an outage.
ACTIVE = (("due", 2000), ("scheduled", 1000), ("failed", 300), ("running", 100))
NAMES = (
    "soak.ok",
    "soak.web",
    "soak.keyed",
    "soak.member",
    "soak.retry",
    "soak.async",
    "soak.snooze",
    "soak.step",
    "soak.slow",
    "soak.limited",
    "soak.dead",
    "soak.timeout",
)
BATCHES = 20
WORKFLOWS = 10
STEP = 500_000


def _finished_sql() -> str:
    """The CASE expression of history row ``i``'s state."""
    bounds = []
    total = 0
    for name, share in SHARES:
        total += share
        bounds.append((name, total))
    cases = " ".join(f"WHEN i %% 1000 < {b} THEN '{n}'" for n, b in bounds[:-1])
    return f"CASE {cases} ELSE '{bounds[-1][0]}' END"


def _active_sql(first: int, active: list[tuple[str, int]]) -> str:
    """The CASE expression of the state of row ``i`` of the unfinished ones, numbered from
    ``first``."""
    bounds, total = [], first
    for name, count in active:
        total += count
        bounds.append((name, total))
    cases = " ".join(f"WHEN i < {b} THEN '{n}'" for n, b in bounds[:-1])
    return f"CASE {cases} ELSE '{bounds[-1][0]}' END"


def active_rows(backlog: int = 0) -> list[tuple[str, int]]:
    """The unfinished rows by kind: ACTIVE, with ``backlog`` more due."""
    return [(kind, count + (backlog if kind == "due" else 0)) for kind, count in ACTIVE]


def fill(cursor: Any, rows: int, spread_s: float, backlog: int = 0) -> float:
    """Insert ``rows`` jobs: the unfinished ones of active_rows(``backlog``) last (the
    newest ids), the others finished over the last ``spread_s`` seconds, the newest ids the
    newest; returns the seconds it took."""
    started = time.monotonic()
    active = active_rows(backlog)
    history = rows - sum(count for _, count in active)
    if history < 1:
        raise ValueError(f"--rows {rows:,} leaves no finished rows beside the unfinished ones")
    for first in range(1, history + 1, STEP):
        last = min(first + STEP - 1, history)
        _insert(cursor, first, last, rows, spread_s, _finished_sql())
        print(f"  {last:,} rows", flush=True)
    for first in range(history + 1, rows + 1, STEP):
        last = min(first + STEP - 1, rows)
        _insert(cursor, first, last, rows, spread_s, _active_sql(history + 1, active))
    return time.monotonic() - started


def _insert(cursor: Any, first: int, last: int, rows: int, spread_s: float, kind: str) -> None:
    """Rows ``first`` to ``last`` of ``rows``, their state the SQL expression ``kind``."""
    names = "ARRAY[" + ", ".join(f"'{n}'" for n in NAMES) + "]"
    cursor.execute(
        "INSERT INTO django_gator_job (name, args, kwargs, queue, priority, "
        "next_execution_at, state, attempts, rescues, created_at, started_at, "
        "finished_at, locked_at, last_error, errors, error_class, reserved_by, batch_id) "
        "SELECT name, '[]', jsonb_build_object('ms', i %% 5, 'token', 'v' || i), "
        "CASE WHEN name = 'soak.limited' THEN 'soak-limited' WHEN i %% 50 = 0 THEN "
        "'default' ELSE 'soak' END, 0, "
        "CASE kind WHEN 'due' THEN now() - (i %% 30) * interval '1 second' "
        "WHEN 'scheduled' THEN now() + (i %% 3600) * interval '1 second' "
        "WHEN 'failed' THEN now() + (i %% 60) * interval '1 second' ELSE t END, "
        "CASE kind WHEN 'due' THEN 'waiting' WHEN 'scheduled' THEN 'waiting' ELSE kind END, "
        "CASE WHEN kind IN ('due', 'scheduled') THEN 0 ELSE 1 END, 0, "
        "t - interval '1 second', CASE WHEN kind IN ('due', 'scheduled') THEN NULL "
        "ELSE t END, CASE WHEN kind IN ('succeeded', 'cancelled', 'dead') THEN t END, "
        "CASE WHEN kind = 'running' THEN now() END, "
        "CASE kind WHEN 'dead' THEN 'ValueError: soak: this job always fails' "
        "WHEN 'failed' THEN 'RuntimeError: soak: attempt 1 of 2 failing attempts' "
        "ELSE '' END, "
        "CASE WHEN kind IN ('dead', 'failed') THEN jsonb_build_array(jsonb_build_object("
        "'class', CASE kind WHEN 'dead' THEN 'ValueError' ELSE 'RuntimeError' END, "
        "'message', 'soak', 'at', t)) ELSE '[]'::jsonb END, "
        "CASE kind WHEN 'dead' THEN 'ValueError' WHEN 'failed' THEN 'RuntimeError' END, "
        "CASE WHEN kind IN ('due', 'scheduled') THEN NULL ELSE 'volume-worker' END, "
        f"CASE WHEN i %% 100 = 0 THEN 1 + (i / 100) %% {BATCHES} END "
        f"FROM (SELECT i, ({names})[1 + i %% {len(NAMES)}] AS name, {kind} AS kind, "
        "now() - (%s - i) * %s * interval '1 second' AS t "
        "FROM generate_series(%s::bigint, %s::bigint) AS i) AS s",
        [rows, spread_s / rows, first, last],
    )


#: The fleet whose tallies fill_tallies() writes: worker processes, and heartbeats a minute
#: (GATOR_HEARTBEAT_INTERVAL of 5 s), each writing a row per queue it ran jobs of.
TALLY_WORKERS = 12
TALLY_FLUSHES = 12
TALLY_QUEUES = ("soak", "soak-limited", "default")


def fill_tallies(cursor: Any, spread_s: float) -> int:
    """The rows of ``django_gator_finished_tally`` the workers would have written for the
    fill's finished jobs (django_gator.tallies: one per worker, heartbeat and queue, kept two
    hours): for each minute of the spread, at most the last 120, TALLY_WORKERS x
    TALLY_FLUSHES rows per queue of TALLY_QUEUES, the day's rate split between them (about
    1 % dead). Returns the rows written."""
    minutes = max(1, min(120, int(spread_s // 60) + 1))
    per_row = 1157 * 60 / (TALLY_WORKERS * TALLY_FLUSHES * len(TALLY_QUEUES))
    queues = "ARRAY[" + ", ".join(f"'{q}'" for q in TALLY_QUEUES) + "]"
    cursor.execute(
        "INSERT INTO django_gator_finished_tally (minute, queue, succeeded, dead) "
        "SELECT date_trunc('minute', now()) - m * interval '1 minute', q, %s, %s "
        f"FROM generate_series(0, %s) AS m, unnest({queues}) AS q, "
        "generate_series(1, %s) AS f",
        [
            round(per_row * 0.99),
            max(1, round(per_row * 0.01)),
            minutes - 1,
            TALLY_WORKERS * TALLY_FLUSHES,
        ],
    )
    return int(cursor.rowcount)


def seed_oldest(cursor: Any, spread_s: float) -> None:
    """One succeeded job older than the spread: a conversion then makes time partitions
    from its day or hour on, so the fill lands in them rather than the default partition."""
    cursor.execute(
        "INSERT INTO django_gator_job (name, args, kwargs, queue, priority, next_execution_at, "
        "state, attempts, rescues, created_at, started_at, finished_at, last_error, errors) "
        "SELECT 'soak.ok', '[]', '{}', 'soak', 0, t, 'succeeded', 1, 0, t, t, t, '', '[]' "
        "FROM (SELECT now() - %s * interval '1 second' AS t) AS s",
        [spread_s + 600],
    )


def companions() -> dict[str, Any]:
    """The batches the filled rows belong to, a few workflows (dispatched through the API,
    so their first steps are waiting jobs), and the superuser."""
    from django.contrib.auth import get_user_model

    from benchmarks.soak.app.jobs import SoakStep
    from django_gator import Workflow
    from django_gator.models import Batch

    batches = [
        Batch.objects.create(description=f"volume batch {n}", closed=True, size=1)
        for n in range(1, BATCHES + 1)
    ]
    workflows = []
    for n in range(WORKFLOWS):
        wf = Workflow(name=f"volume workflow {n}")
        a = wf.add(SoakStep, f"wf-{n}", "a")
        b = wf.add(SoakStep, f"wf-{n}", "b", after=[a])
        wf.add(SoakStep, f"wf-{n}", "c", after=[b])
        workflows.append(wf.dispatch())
    user = get_user_model().objects.create_superuser("volume", "volume@example.com", "volume")
    return {"batches": [b.id for b in batches], "workflows": workflows, "user": user}
