"""This round's features in the soak: how the harness dispatches them, what it samples
every minute, and the checks of the report.

Dispatching (:class:`Mixer`): the mix's weights are in jobs. The plain kinds are
dispatched as they come due; the others are gathered and dispatched as a user would:

- ``keyed``: bursts of 1 to 12 jobs for one account (an account's backlog being synced),
  over ``accounts`` active accounts, of which one leaves and a new one arrives every
  minute (keys come and go, as customers do);
- ``batch``: a ``Batch`` of 20 to 200 members with ``on_complete`` and ``on_success``;
- ``workflow``: a diamond (a, then b and c, then d), four jobs;
- ``limited``, ``async``, ``snooze``: one job each, as they come due.

The harness counts what it dispatched per job name, and what the workers will dispatch
for it (two callbacks per batch, four steps per workflow). Outcomes are counted from the
jobs table plus the rows deleted from it, by name and state (a trigger keeps the count,
app/migrations/0002), so the automatic pruner cannot hide a loss: a job that never ran
is missing from both, and a row deleted before it ended would be counted in its state.
"""

from __future__ import annotations

import math
import random
import re
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

#: The state every job of a kind ends in (the mix is deterministic about that).
FINAL_STATE = {
    "soak.ok": "succeeded",
    "soak.retry": "succeeded",  # 1 or 2 failures, then success: 3 retries allowed
    "soak.dead": "dead",
    "soak.timeout": "dead",
    "soak.slow": "succeeded",
    "soak.keyed": "succeeded",
    "soak.limited": "succeeded",
    "soak.async": "succeeded",
    "soak.snooze": "succeeded",
    "soak.member": "succeeded",
    "soak.batch_complete": "succeeded",
    "soak.batch_success": "succeeded",
    "soak.step": "succeeded",
    "soak.web": "succeeded",  # web.py; its fails are retried (at most 2 of 3 allowed)
}
ACTIVE_STATES = ("waiting", "failed", "running")
FINISHED_STATES = ("succeeded", "dead", "cancelled")
#: Kinds gathered before they are dispatched (see the module's docstring).
GATHERED = ("keyed", "batch", "workflow")
#: The share of their limits the flow-limited kinds are offered (see :func:`flow_sizing`).
FLOW_HEADROOM = 0.7
#: A limited job's run time in ms (uniform), where its queue's limit allows it.
LIMITED_MS = (100.0, 500.0)
DIAMOND = (("a", ()), ("b", ("a",)), ("c", ("a",)), ("d", ("b", "c")))


@dataclass
class Mixer:
    """Turns the kinds the rate makes due into dispatches; keeps what was dispatched."""

    rng: random.Random
    accounts: int = 50
    limited_ms: tuple[float, float] = LIMITED_MS
    started: float = field(default_factory=time.monotonic)
    #: job name -> jobs that will exist for what the harness dispatched
    expected: Counter[str] = field(default_factory=Counter)
    pending: Counter[str] = field(default_factory=Counter)
    batches: list[int] = field(default_factory=list)
    workflows: list[str] = field(default_factory=list)
    next_burst: int = 1
    next_batch: int = 20
    dispatched: int = 0  # job rows inserted or to be inserted by the workers for them

    def add(self, kinds: list[str]) -> None:
        """Dispatch ``kinds`` (one job each), or gather them."""
        from benchmarks.soak.app.jobs import KINDS

        groups: dict[str, list[Any]] = defaultdict(list)
        for kind in kinds:
            if kind in GATHERED:
                self.pending[kind] += 1
            elif kind == "limited":
                groups[kind].append({"ms": round(self.rng.uniform(*self.limited_ms))})
            else:
                groups[kind].append(arguments(kind, self.rng))
        for kind, items in groups.items():
            KINDS[kind].dispatch_many(items)
            self._count(KINDS[kind].name, len(items))
        self._keyed()
        self._batches()
        self._workflows()

    def flush(self) -> None:
        """Dispatch what is gathered (the end of the run): a last smaller batch or burst."""
        if self.pending["keyed"]:
            self.next_burst = self.pending["keyed"]
            self._keyed()
        if self.pending["batch"]:
            self.next_batch = self.pending["batch"]
            self._batches()

    def _count(self, name: str, jobs: int) -> None:
        self.expected[name] += jobs
        self.dispatched += jobs

    def active_accounts(self) -> range:
        base = int((time.monotonic() - self.started) // 60)
        return range(base, base + self.accounts)

    def _keyed(self) -> None:
        from benchmarks.soak.app.jobs import SoakKeyed

        while self.pending["keyed"] >= self.next_burst:
            account = self.rng.choice(self.active_accounts())
            burst = self.next_burst
            SoakKeyed.dispatch_many(
                [[account, round(self.rng.uniform(50, 350))] for _ in range(burst)]
            )
            self._count(SoakKeyed.name, burst)
            self.pending["keyed"] -= burst
            self.next_burst = self.rng.randint(1, 12)

    def _batches(self) -> None:
        from benchmarks.soak.app.jobs import SoakBatchComplete, SoakBatchSuccess, SoakMember
        from django_gator import Batch

        while self.pending["batch"] >= self.next_batch:
            size = self.next_batch
            with Batch(
                on_complete=SoakBatchComplete,
                on_success=SoakBatchSuccess,
                description=f"soak batch {len(self.batches) + 1}",
            ) as batch:
                SoakMember.dispatch_many(
                    [{"ms": round(self.rng.uniform(0, 4), 2)} for _ in range(size)]
                )
            self.batches.append(batch.id)
            self._count(SoakMember.name, size)
            self._count(SoakBatchComplete.name, 1)
            self._count(SoakBatchSuccess.name, 1)
            self.pending["batch"] -= size
            self.next_batch = self.rng.randint(20, 200)

    def _workflows(self) -> None:
        from benchmarks.soak.app.jobs import SoakStep
        from django_gator import Workflow

        while self.pending["workflow"] >= len(DIAMOND):
            label = f"wf-{len(self.workflows) + 1}"
            wf = Workflow(name=f"soak {label}")
            steps: dict[str, Any] = {}
            for step, after in DIAMOND:
                ms = round(self.rng.uniform(0, 20), 1)
                steps[step] = wf.add(SoakStep, label, step, ms, after=[steps[a] for a in after])
            wf.dispatch()
            self.workflows.append(label)
            self._count(SoakStep.name, len(DIAMOND))
            self.pending["workflow"] -= len(DIAMOND)


def flow_sizing(
    rate: float, mix: dict[str, float], accounts: int | None, limits: tuple[int, float]
) -> tuple[int, tuple[float, float]]:
    """The active accounts and the limited jobs' run times (ms) for the harness's ``rate``
    (jobs/s) and ``mix``, so that the flow-limited kinds are offered FLOW_HEADROOM of what
    their limits let through: a queue offered more than its limit allows grows for ever
    by design (in the soak as in production), which says nothing about the system.
    ``limits``: the limited queue's concurrency and one account's starts per second.
    ``accounts`` given: kept, unless fewer than the rate needs."""
    total = sum(mix.values())
    concurrency, per_account = limits
    keyed = rate * mix.get("keyed", 0.0) / total
    needed = math.ceil(keyed / (per_account * FLOW_HEADROOM)) if keyed else 0
    chosen = max(accounts or 50, needed)
    limited = rate * mix.get("limited", 0.0) / total
    ms = LIMITED_MS
    if limited:
        mean_ms = FLOW_HEADROOM * concurrency / limited * 1000
        if mean_ms < sum(LIMITED_MS) / 2:
            ms = (round(mean_ms / 3, 1), round(mean_ms * 5 / 3, 1))
    return chosen, ms


def arguments(kind: str, rng: random.Random) -> Any:
    """One job's arguments for a kind dispatched as it comes due."""
    if kind == "ok":
        return {"ms": round(rng.uniform(0, 4), 2)}
    if kind == "retry":
        return {"fails": rng.choice((1, 2))}
    if kind == "timeout":
        return {"seconds": 5.0}
    if kind == "slow":
        return {"ms": round(rng.uniform(500, 2000))}
    if kind == "async":
        return {"ms": round(rng.uniform(10, 200))}
    return []


# -- per minute -----------------------------------------------------------------------------
_FINISHED_LINE = re.compile(r"^gator_jobs_finished_total\{([^}]*)\} ([0-9.e+]+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(port: int, timeout: float = 5.0) -> dict[str, Any]:
    """One scrape of a worker's /metrics: whether it answered, and its finished-jobs
    counters by (job, outcome)."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as reply:
            text = reply.read().decode()
            status = reply.status
    except OSError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finished: Counter[str] = Counter()
    for line in text.splitlines():
        match = _FINISHED_LINE.match(line)
        if match:
            labels = dict(_LABEL.findall(match.group(1)))
            finished[f"{labels.get('job')}|{labels.get('outcome')}"] += int(float(match.group(2)))
    return {
        "ok": status == 200,
        "ms": round((time.monotonic() - started) * 1000, 1),
        "bytes": len(text),
        "finished_total": sum(finished.values()),
        "finished": dict(finished),
    }


def ledger_stale_after(window_s: float, prune_interval_s: float) -> float:
    """Seconds after which no row of the rate-limit ledger should be left, for scopes whose
    rate window is ``window_s``. The pruner deletes a scope's rows once its *newest* row is
    older than the window and the margin for quiet scopes (IDLE_MARGIN); the scope's other
    rows are at most a window older than its newest (its last start's claim deleted those
    before), so its oldest row can reach two windows and the margin, plus the wait for the
    next pass (up to 1.5 intervals, the pruner's jitter), plus 30 s."""
    from django_gator.worker.pruner import IDLE_MARGIN

    return 2 * window_s + IDLE_MARGIN + 1.5 * prune_interval_s + 30


def tables(cursor: Any, stale_after: float, now_sql: str = "now()") -> dict[str, Any]:
    """Row counts of the tables this round added (which no pruning of jobs empties), and
    the rate-limit ledger: its rows, and those older than ``stale_after`` seconds (past
    every window of the soak's limits by more than a pruning interval)."""
    out: dict[str, Any] = {}
    for table in (
        "django_gator_batch",
        "django_gator_workflow",
        "django_gator_workflow_step",
        "django_gator_flow_start",
        "django_gator_lease",
        "gator_soak_callbackrun",
        "gator_soak_steprun",
        "gator_soak_limitedrun",
    ):
        cursor.execute(f"SELECT count(*) FROM {table}")
        out[table] = cursor.fetchone()[0]
    cursor.execute("SELECT state, sum(count) FROM gator_soak_deletedjobs GROUP BY state")
    out["deleted_by_state"] = {state: int(n) for state, n in cursor.fetchall()}
    if cursor.db.vendor == "postgresql":
        age = f"EXTRACT(EPOCH FROM {now_sql} - min(started_at))"
        cutoff = f"{now_sql} - %s * interval '1 second'"
    else:  # MariaDB/MySQL
        age = f"TIMESTAMPDIFF(MICROSECOND, min(started_at), {now_sql}) / 1e6"
        cutoff = f"{now_sql} - INTERVAL %s MICROSECOND"
        stale_after = int(stale_after * 1e6)
    cursor.execute(f"SELECT count(*), count(DISTINCT scope), {age} FROM django_gator_flow_start")
    rows, scopes, oldest = cursor.fetchone()
    cursor.execute(
        "SELECT count(*), count(DISTINCT scope) FROM django_gator_flow_start "
        f"WHERE started_at < {cutoff}",
        [stale_after],
    )
    stale, stale_scopes = cursor.fetchone()
    if cursor.db.vendor != "postgresql":
        stale_after = stale_after / 1e6
    out["flow_start"] = {
        "rows": rows,
        "scopes": scopes,
        "oldest_s": round(float(oldest or 0.0), 1),
        "stale_after_s": stale_after,
        "stale_rows": stale,
        "stale_scopes": stale_scopes,
    }
    return out


# -- the checks at the end ------------------------------------------------------------------
@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def outcome_counts(cursor: Any) -> dict[str, dict[str, dict[str, int]]]:
    """job name -> {"live": {state: n}, "deleted": {state: n}}."""
    out: dict[str, dict[str, dict[str, int]]] = defaultdict(lambda: {"live": {}, "deleted": {}})
    cursor.execute("SELECT name, state, count(*) FROM django_gator_job GROUP BY name, state")
    for name, state, n in cursor.fetchall():
        out[name]["live"][state] = int(n)
    cursor.execute("SELECT name, state, count FROM gator_soak_deletedjobs")
    for name, state, n in cursor.fetchall():
        out[name]["deleted"][state] = int(n)
    return dict(out)


def check_outcomes(expected: Counter[str], counts: dict[str, Any]) -> list[Check]:
    checks = []
    active = _rows_in(counts, "live", lambda state: state in ACTIVE_STATES)
    checks.append(
        Check(
            "no job left waiting, failed or running",
            not active,
            f"left: {active}" if active else "0 rows in waiting, failed or running",
        )
    )
    deleted_active = _rows_in(counts, "deleted", lambda state: state not in FINISHED_STATES)
    checks.append(
        Check(
            "no row deleted before it ended",
            not deleted_active,
            f"deleted while active: {deleted_active}" if deleted_active else "none",
        )
    )
    lines = []
    ok = True
    for name in sorted(set(expected) | set(counts)):
        c = counts.get(name, {"live": {}, "deleted": {}})
        finished = Counter({s: c["live"].get(s, 0) for s in FINISHED_STATES})
        finished.update({s: c["deleted"].get(s, 0) for s in FINISHED_STATES})
        total = sum(finished.values())
        want_state = FINAL_STATE.get(name)
        good = total == expected.get(name, 0) and finished[want_state] == total
        ok &= good
        pruned = sum(c["deleted"].values())
        lines.append(
            f"{name}: dispatched {expected.get(name, 0)}, finished {total} "
            f"({', '.join(f'{s} {n}' for s, n in sorted(finished.items()) if n)}; "
            f"{pruned} of them pruned){'' if good else '  <-- MISMATCH'}"
        )
    checks.append(Check("every dispatched job finished, once, as expected", ok, "\n".join(lines)))
    return checks


def _rows_in(
    counts: dict[str, Any], part: str, wanted: Callable[[str], bool]
) -> dict[str, dict[str, int]]:
    """job name -> {state: rows} of ``counts[name][part]`` in the ``wanted`` states (the
    names with none left out)."""
    out = {}
    for name, c in counts.items():
        states = {state: n for state, n in c[part].items() if wanted(state)}
        if states:
            out[name] = states
    return out


def check_metrics(
    final: list[dict[str, Any]], counts: dict[str, Any], minutes: list[Any]
) -> list[Check]:
    """The workers' finished-jobs counters: answered every minute, grew every minute of
    dispatch, and add up to the outcomes in the database."""
    checks = []
    scrapes = [s for m in minutes for s in m.get("metrics") or []]
    failed = [s for s in scrapes if not s.get("ok")]
    checks.append(
        Check(
            "/metrics answered every scrape",
            bool(scrapes) and not failed and all(s.get("ok") for s in final),
            f"{len(scrapes)} scrapes in the run, {len(failed)} failed"
            + (f" ({failed[0].get('error')})" if failed else "")
            + f"; final scrape: {[s.get('ok') for s in final]}",
        )
    )
    totals = [
        sum(s.get("finished_total", 0) for s in m["metrics"])
        for m in minutes
        if m.get("metrics") and not m.get("partial")
    ]
    flat = [i + 2 for i in range(len(totals) - 1) if totals[i + 1] <= totals[i]]
    if len(totals) >= 2:  # judged from two full minutes on
        checks.append(
            Check(
                "finished-jobs counters grew every minute",
                not flat,
                f"{totals[0]} at minute 1 -> {totals[-1]} at the "
                f"last full minute; minutes without growth: {flat or 'none'}",
            )
        )
    by_name: Counter[str] = Counter()
    for scrape_ in final:
        by_name.update(scrape_.get("finished", {}))
    lines, ok = [], True
    for name in sorted(FINAL_STATE):
        c = counts.get(name, {"live": {}, "deleted": {}})
        want_state = FINAL_STATE[name]
        db = c["live"].get(want_state, 0) + c["deleted"].get(want_state, 0)
        metric = by_name.get(f"{name}|{want_state}", 0)
        good = metric == db
        ok &= good
        snoozed = by_name.get(f"{name}|snoozed", 0)
        lines.append(
            f"{name}: {want_state} {metric} in /metrics, {db} in the database"
            + (f", snoozed {snoozed}" if snoozed else "")
            + ("" if good else "  <-- MISMATCH")
        )
    snooze_jobs = sum(counts.get("soak.snooze", {"live": {}}).get("live", {}).values()) + sum(
        counts.get("soak.snooze", {"deleted": {}}).get("deleted", {}).values()
    )
    snoozed = by_name.get("soak.snooze|snoozed", 0)
    ok &= snoozed == snooze_jobs
    lines.append(f"soak.snooze: {snoozed} snoozes for {snooze_jobs} jobs (each snoozes once)")
    checks.append(
        Check("/metrics finished counts = outcomes in the database", ok, "\n".join(lines))
    )
    return checks


def check_batches(batch_ids: list[int]) -> list[Check]:
    from benchmarks.soak.app.models import CallbackRun
    from django_gator.models import Batch

    runs: dict[int, Counter[str]] = defaultdict(Counter)
    for batch_id, callback in CallbackRun.objects.values_list("batch_id", "callback"):
        runs[batch_id][callback] += 1
    wrong = {
        b: dict(runs.get(b, {}))
        for b in batch_ids
        if runs.get(b, Counter()) != Counter({"complete": 1, "success": 1})
    }
    strangers = sorted(set(runs) - set(batch_ids))
    rows = Batch.objects.filter(id__in=batch_ids)
    not_done = rows.exclude(completed_generation=1, success_dispatched=True).count()
    ok = bool(batch_ids) and not wrong and not strangers and not not_done
    sizes = list(rows.values_list("size", flat=True))
    detail = (
        f"{len(batch_ids)} batches ({min(sizes, default=0)}-{max(sizes, default=0)} members, "
        f"{sum(sizes)} in all): on_complete and on_success ran once each for "
        f"{len(batch_ids) - len(wrong)}"
    )
    if wrong:
        detail += f"; wrong: {dict(list(wrong.items())[:10])} ({len(wrong)} batches)"
    if strangers:
        detail += f"; callbacks of batches not dispatched: {strangers[:10]}"
    if not_done:
        detail += f"; {not_done} batch rows not completed once with success"
    return [Check("batch callbacks ran exactly once", ok, detail)]


def check_workflows(labels: list[str]) -> list[Check]:
    from benchmarks.soak.app.models import StepRun
    from django_gator.models import WorkflowStep

    runs: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for label, step, started, ended in StepRun.objects.values_list(
        "workflow", "step", "started", "ended"
    ):
        runs[label][step].append((started, ended))
    twice, missing, disorder = [], [], []
    for label in labels:
        steps = runs.get(label, {})
        if any(len(v) > 1 for v in steps.values()):
            twice.append(label)
        if set(steps) != {s for s, _ in DIAMOND}:
            missing.append(label)
            continue
        for step, after in DIAMOND:
            start = steps[step][0][0]
            if any(start < steps[a][0][1] for a in after):
                disorder.append(f"{label}:{step}")
    steps_by_state = dict(
        Counter(WorkflowStep.objects.values_list("state", flat=True)).most_common()
    )
    left = {s: n for s, n in steps_by_state.items() if s != "succeeded"}
    strangers = sorted(set(runs) - set(labels))
    ok = bool(labels) and not twice and not missing and not disorder and not left and not strangers
    detail = (
        f"{len(labels)} diamonds (a; b, c after a; d after b and c): steps run twice: "
        f"{len(twice)}, workflows with a step missing: {len(missing)}, a step started before "
        f"a step it comes after ended: {len(disorder)}; workflow steps by state: {steps_by_state}"
    )
    for what, items in (("twice", twice), ("missing", missing), ("disorder", disorder)):
        if items:
            detail += f"; {what}: {items[:10]}"
    if strangers:
        detail += f"; runs of workflows not dispatched: {strangers[:10]}"
    return [Check("workflow steps ran once each, in dependency order", ok, detail)]


def _max_overlap(intervals: list[tuple[float, float]]) -> tuple[int, float]:
    """Most intervals open at once, and the total seconds during which that many were."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most = current = 0
    at_most = 0.0
    last = None
    for t, delta in events:
        if last is not None and current == most and most:
            at_most += t - last
        current += delta
        if current > most:
            most, at_most = current, 0.0
        last = t
    return most, at_most


def check_limits(key_limit: int, queue_limit: int, rate: tuple[int, int]) -> list[Check]:
    """Concurrency: the handlers' [start, end] intervals (inside the jobs' running time)
    of one key, or of the limited queue, never overlap more than the limit. Rate: the
    claim times (the rows' locked_at, the limited claim's database time) of one key
    never put more than the limit's starts in one window."""
    from benchmarks.soak.app.models import LimitedRun

    by_scope: dict[str, list[tuple[float, float]]] = defaultdict(list)
    claims: dict[str, list[float]] = defaultdict(list)
    for scope, started, ended, claimed_at in LimitedRun.objects.values_list(
        "scope", "started", "ended", "claimed_at"
    ):
        by_scope[scope].append((started, ended))
        if claimed_at is not None:
            claims[scope].append(claimed_at.timestamp())
    checks: list[Check] = []
    key_scopes = [s for s in by_scope if s.startswith("key:")]
    queue_scopes = [s for s in by_scope if s.startswith("queue:")]
    if queue_scopes:
        qmost, qseconds = _max_overlap([i for s in queue_scopes for i in by_scope[s]])
        checks.append(
            Check(
                f"limited queue's concurrency <= {queue_limit}",
                qmost <= queue_limit,
                f"{sum(len(by_scope[s]) for s in queue_scopes)} runs: most at once {qmost} "
                f"({qseconds:.0f} s at that)",
            )
        )
    if not key_scopes:
        return checks
    worst = {s: _max_overlap(by_scope[s]) for s in key_scopes}
    most = max((w[0] for w in worst.values()), default=0)
    at_limit = sum(1 for w in worst.values() if w[0] == key_limit)
    seconds_at_limit = sum(w[1] for w in worst.values() if w[0] == key_limit)
    over = sorted(s for s, w in worst.items() if w[0] > key_limit)
    checks.append(
        Check(
            f"per-key concurrency <= {key_limit}",
            not over,
            f"{sum(len(by_scope[s]) for s in key_scopes)} keyed runs over {len(key_scopes)} "
            f"accounts: most at once for one account {most}; {at_limit} accounts reached "
            f"{key_limit} ({seconds_at_limit:.0f} s in all)"
            + (f"; over the limit: {over[:10]}" if over else ""),
        )
    )
    starts, window = rate
    exceeded: list[str] = []
    reached = 0
    for scope in key_scopes:
        times = sorted(claims[scope])
        for i in range(len(times) - starts):
            if times[i + starts] - times[i] < window:
                first = datetime.fromtimestamp(times[i], UTC).isoformat(timespec="milliseconds")
                exceeded.append(
                    f"{scope}: {starts + 1} claims from {first} in "
                    f"{times[i + starts] - times[i]:.3f} s"
                )
                break
        reached += sum(
            1 for i in range(len(times) - starts + 1) if times[i + starts - 1] - times[i] < window
        )
    missing = sum(len(by_scope[s]) - len(claims[s]) for s in key_scopes)
    checks.append(
        Check(
            f"per-key rate <= {starts} starts per {window} s",
            not exceeded and not missing,
            f"windows in which an account had {starts} starts (the limit reached): {reached}; "
            f"accounts over it: {len(exceeded)}"
            + (f" {exceeded[:10]}" if exceeded else "")
            + (f"; runs without a claim time: {missing}" if missing else ""),
        )
    )
    return checks


def check_minutes(
    minutes: list[dict[str, Any]], summary: dict[str, Any], bound_rows: float | None
) -> list[Check]:
    """What the per-minute records must show: the jobs table bounded by the pruner, the
    rate-limit ledger within its windows, worker memory and threads flat, claim and mark
    latency flat."""
    full = [m for m in minutes if not m.get("partial")]
    checks = []
    if bound_rows is not None:
        rows = [m["table"]["rows"] - m["table"]["by_state"].get("dead", 0) for m in full]
        worst = max(rows, default=0)
        checks.append(
            Check(
                "jobs table bounded by the pruner (rows not dead)",
                bool(rows) and worst <= bound_rows,
                f"max {worst} rows (bound: rate x (retention [+ a time partition's span] + 1.5 x "
                f"prune interval + 120 s) = "
                f"{bound_rows:.0f}); every 10 minutes: "
                + ", ".join(str(r) for r in rows[9::10])
                + f"; dead rows (kept until gator_prune --dead) at the end: "
                f"{full[-1]['table']['by_state'].get('dead', 0) if full else '-'}",
            )
        )
    flows = [m["features"]["flow_start"] for m in full if m.get("features")]
    # Judged once a key could have rows older than stale_after (not in a shorter run).
    if flows and len(flows) > int(flows[0]["stale_after_s"] // 60) + 1:
        stale_after = flows[0]["stale_after_s"]
        # A key can hold rows from before the first prune, until the first pruning pass.
        judged = flows[int(stale_after // 60) + 1 :]
        stale = [f["stale_rows"] for f in judged]
        checks.append(
            Check(
                "rate-limit ledger (FlowStart) pruned as its windows pass",
                max(stale) == 0,
                f"rows older than {stale_after:g} s (two windows + the pruner's margin for "
                f"quiet scopes + 1.5 x prune interval + 30 s): "
                f"max {max(stale, default=0)}, at the end {stale[-1] if stale else '-'}; "
                f"ledger rows max {max(f['rows'] for f in flows)}, at the end "
                f"{flows[-1]['rows']} over {flows[-1]['scopes']} scopes",
            )
        )
    span = summary.get("compared_minutes") or 0
    if full and span:
        first, last = full[:span], full[-span:]
        lines, ok = [], True
        for i in range(len(full[0]["workers"])):
            rss0 = _median([m["workers"][i]["rss_mb"] for m in first])
            rss1 = _median([m["workers"][i]["rss_mb"] for m in last])
            # Threads at each minute's end (a scrape of /metrics can add one for a moment).
            th0 = _median([m["workers"][i]["threads"] for m in first])
            th1 = _median([m["workers"][i]["threads"] for m in last])
            peak0 = max(m["workers"][i]["threads_max"] for m in first)
            peak1 = max(m["workers"][i]["threads_max"] for m in last)
            good = rss1 <= rss0 * 1.10 and th1 <= th0
            ok &= good
            lines.append(
                f"worker {i + 1}: RSS {rss0:.1f} -> {rss1:.1f} MiB (x{rss1 / rss0:.3f}), "
                f"threads {th0:g} -> {th1:g} (peaks {peak0} -> {peak1})"
            )
        checks.append(
            Check("workers' RSS (median, <= +10 %) and threads (median) flat", ok, "; ".join(lines))
        )
        lines, ok = [], True
        for name in ("claim", "mark"):
            s = summary[name]
            for q, limit in (("p50", 1.5), ("p99", 2.0)):
                ratio = s[f"ratio_{q}"]
                good = ratio is not None and ratio <= limit
                ok &= good
                lines.append(
                    f"{name} {q} {s['first'][q]} -> {s['last'][q]} ms (x{ratio}, limit x{limit})"
                )
        checks.append(Check("claim and mark latency flat", ok, "; ".join(lines)))
    return checks


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
