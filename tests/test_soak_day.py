"""The day-in-an-hour soak's checks (benchmarks/soak/day.py) fail on doctored reports: a lost
job, a job run twice, a rolled-back job that ran, a backlog that grew, claim p99 or size
grown by more than 1.3x, a partition left past its retention. No database: the checks are
functions of the per-minute records and the files ledger."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from benchmarks.soak import day


def _minutes(count: int, *, late_from: int | None = None, **late: float) -> list:
    """``count`` full minute records, steady (claim p99 5 ms, 100 MiB, 3 jobs due, the oldest
    due for 0.5 s); from minute ``late_from`` on, the values in ``late`` (claim_p99, size,
    due, oldest) replace the steady ones."""
    steady = {"claim_p99": 5.0, "size": 100.0, "due": 3, "oldest": 0.5}
    records = []
    for minute in range(1, count + 1):
        v = {**steady, **late} if late_from is not None and minute >= late_from else steady
        records.append(
            {
                "minute": minute,
                "partial": False,
                "claim": {"p50": 1.0, "p99": v["claim_p99"]},
                "storage": {"total_mb": v["size"], "hot_mb": 10.0, "claimed_mb": 10.0},
                "backlog": {"due_max": int(v["due"]), "oldest_s_max": v["oldest"]},
            }
        )
    return records


def _runs(*tokens: str) -> list[list[str]]:
    return [[token, "1", "ok"] for token in tokens]


def test_ledger_passes_when_each_committed_job_ran_once():
    runs = [*_runs("w0-1", "w0-2"), ["w0-3", "1", "fail"], ["w0-3", "2", "ok"]]
    check = day.check_ledger(["w0-1", "w0-2", "w0-3"], ["w0-4"], runs, rescues=0)
    assert check.ok, check.detail


def test_ledger_fails_on_a_lost_job():
    check = day.check_ledger(["w0-1", "w0-2"], [], _runs("w0-1"), rescues=0)
    assert not check.ok
    assert "lost 1" in check.detail
    assert "w0-2" in check.detail


def test_ledger_fails_on_a_job_run_twice_unless_a_rescue_explains_it():
    runs = _runs("w0-1", "w0-1", "w0-2")
    assert not day.check_ledger(["w0-1", "w0-2"], [], runs, rescues=0).ok
    assert day.check_ledger(["w0-1", "w0-2"], [], runs, rescues=1).ok
    # The same attempt run twice counts too, even if only one run succeeded.
    again = [["w0-1", "1", "fail"], ["w0-1", "1", "ok"]]
    assert not day.check_ledger(["w0-1"], [], again, rescues=0).ok


def test_ledger_fails_when_a_rolled_back_job_ran():
    check = day.check_ledger(["w0-1"], ["w0-2"], _runs("w0-1", "w0-2"), rescues=0)
    assert not check.ok
    assert "of them rolled back: 1" in check.detail


def test_growth_checks_pass_on_a_flat_run_and_judge_after_the_warmup():
    minutes = _minutes(30)
    # A big first window (minutes 1-3, inside the warmup) is not judged.
    for m in minutes[:3]:
        m["storage"]["total_mb"] = 10.0
    checks = day.check_growth(minutes, 180, (5.0, 6.0), "total_mb")
    assert [c.ok for c in checks] == [True, True], [c.detail for c in checks]
    assert "minutes 4-13 vs 21-30" in checks[0].detail


def test_growth_checks_fail_on_claim_p99_or_size_grown_past_the_limit():
    claim, size = day.check_growth(
        _minutes(60, late_from=51, size=140.0), 360, (5.0, 6.6), "total_mb"
    )
    assert not claim.ok
    assert "x1.32" in claim.detail
    assert not size.ok
    assert "100.0 -> 140.0 MiB (x1.4)" in size.detail
    claim, size = day.check_growth(
        _minutes(60, late_from=51, size=125.0), 360, (5.0, 6.4), "total_mb"
    )
    assert claim.ok
    assert size.ok
    # The part claims read is judged on partitioned storage: there the total may grow until
    # a drop.
    (_, claimed) = day.check_growth(
        _minutes(60, late_from=51, size=500.0), 360, (5.0, 5.0), "claimed_mb"
    )
    assert claimed.ok


def _with_dead(minutes: list, per_job_kib: float, late_per_job_kib: float, late_from: int) -> list:
    """Give each minute 300 more dead jobs than the one before, in a dead partition of
    ``per_job_kib`` KiB a dead job (``late_per_job_kib`` from minute ``late_from`` on)."""
    for m in minutes:
        dead = 300 * m["minute"]
        kib = late_per_job_kib if m["minute"] >= late_from else per_job_kib
        m["table"] = {"by_state": {"dead": dead, "succeeded": 1000}}
        m["storage"]["dead_partition_mb"] = dead * kib / 1024
        m["storage"]["claimed_mb"] = 10.0
    return minutes


def test_the_dead_partition_may_grow_with_the_dead_jobs_but_not_per_dead_job():
    # Dead jobs are kept until an operator retries or prunes them: their partition grows
    # several-fold over the hour here, which is no bloat, and passes.
    grown = day.check_dead_partition(_with_dead(_minutes(60), 1.0, 1.0, 61), 360)
    assert grown.ok, grown.detail
    assert "1.0 -> 1.0 KiB (x1.0)" in grown.detail
    # The same jobs taking 1.5x the room each from minute 51 on (bloat) fail it.
    bloated = day.check_dead_partition(_with_dead(_minutes(60), 1.0, 1.5, 51), 360)
    assert not bloated.ok
    assert "(x1.5)" in bloated.detail
    # A report without the dead partition's size cannot pass it; a run without dead jobs
    # passes.
    assert not day.check_dead_partition(_minutes(60), 360).ok
    none_dead = _with_dead(_minutes(60), 1.0, 1.0, 61)
    for m in none_dead:
        m["table"]["by_state"]["dead"] = 0
        m["storage"]["dead_partition_mb"] = 0.2
    assert day.check_dead_partition(none_dead, 360).ok


def test_the_ledger_bound_allows_a_quiet_scopes_rows_two_windows_and_the_margin():
    from benchmarks.soak.features import ledger_stale_after
    from django_gator.worker.pruner import IDLE_MARGIN

    # The soak's keyed class allows 30 starts a minute: a scope's rows span up to 60 s below
    # its newest, which the pruner deletes once 60 s and the margin old, at its next pass
    # (up to 1.5 intervals on). The earlier bound, one window, failed the hour of
    # 2026-11-28 on 10 rows of one such scope.
    assert ledger_stale_after(60, 60) == 60 + 60 + IDLE_MARGIN + 90 + 30


def test_growth_check_fails_a_run_too_short_to_judge():
    (check,) = day.check_growth(_minutes(5), 300, (5.0, 5.0), "total_mb")
    assert not check.ok
    assert "too short" in check.detail


def test_backlog_check_fails_on_a_job_due_too_long_or_too_many_due():
    assert day.check_backlog(_minutes(10), rate=100).ok
    late = day.check_backlog(_minutes(10, late_from=8, oldest=75.0), rate=100)
    assert not late.ok
    assert "minutes over: [8, 9, 10]" in late.detail
    assert not day.check_backlog(_minutes(10, late_from=9, due=6001), rate=100).ok


def _ledger(end: datetime, *, present: bool, counted: bool = True) -> day.PartitionLedger:
    name = f"django_gator_job_done_{end - timedelta(hours=1):%Y%m%d_%H%M}"
    ledger = day.PartitionLedger()
    if counted:
        ledger.counted[name] = {
            "start": (end - timedelta(hours=1)).isoformat(),
            "end": end.isoformat(),
            "counts": {"soak.web|succeeded": 7, "soak.ok|succeeded": 3},
        }
    if present:
        ledger.present = {name}
    else:
        ledger.drops.append({"partition": name, "noticed": "", "rows": 10, "counted": counted})
    return ledger


def test_drop_check_fails_on_a_partition_left_past_its_retention():
    end = datetime(2026, 11, 28, 2, tzinfo=UTC)
    at = end + timedelta(seconds=300 + 2 * 60 + 61)
    assert not day.check_drops(_ledger(end, present=True), 300, 60, at).ok
    assert day.check_drops(_ledger(end, present=True), 300, 60, at - timedelta(seconds=2)).ok
    dropped = _ledger(end, present=False)
    assert day.check_drops(dropped, 300, 60, at).ok
    assert not day.check_drops(_ledger(end, present=False, counted=False), 300, 60, at).ok


def test_rows_of_dropped_partitions_count_as_deleted():
    ledger = _ledger(datetime(2026, 11, 28, 2, tzinfo=UTC), present=False)
    counts = {"soak.web": {"live": {"succeeded": 2}, "deleted": {"succeeded": 1}}}
    day.add_dropped(counts, ledger.dropped_counts())
    assert counts["soak.web"]["deleted"] == {"succeeded": 8}
    assert counts["soak.ok"] == {"live": {}, "deleted": {"succeeded": 3}}
    assert ledger.dropped_counts() == Counter(
        {("soak.web", "succeeded"): 7, ("soak.ok", "succeeded"): 3}
    )


def test_offered_rate_check_fails_when_the_dispatchers_fell_behind():
    assert day.check_offered(7000, rate=20, seconds=360).ok
    slow = day.check_offered(5000, rate=20, seconds=360)
    assert not slow.ok
    assert "69.4%" in slow.detail


def test_backlog_check_leaves_out_jobs_a_flow_limit_holds():
    minutes = _minutes(10, late_from=6, oldest=178.0)
    for m in minutes:
        m["free_backlog"] = {"due_max": 3, "oldest_s_max": 0.5}
    assert day.check_backlog(minutes, rate=100).ok
    minutes[7]["free_backlog"]["oldest_s_max"] = 61.0
    assert not day.check_backlog(minutes, rate=100).ok


def test_flow_limited_kinds_are_offered_within_their_limits_at_any_rate():
    """features.flow_sizing: enough accounts and short enough limited jobs that the
    flow-limited kinds are offered 70 % of what their limits let through."""
    from benchmarks.soak import features
    from benchmarks.soak.harness import DEFAULT_MIX, mix

    weights = mix(DEFAULT_MIX)
    limits = (3, 0.5)  # the limited queue's concurrency; 30 starts a minute per account
    assert features.flow_sizing(150, weights, None, limits) == (50, features.LIMITED_MS)
    accounts, (low, high) = features.flow_sizing(480, weights, None, limits)
    share = sum(weights.values())
    keyed = 480 * weights["keyed"] / share
    limited = 480 * weights["limited"] / share
    assert keyed / (accounts * 0.5) <= features.FLOW_HEADROOM
    assert keyed / ((accounts - 1) * 0.5) > features.FLOW_HEADROOM  # no more than needed
    assert limited * (low + high) / 2 / 1000 / 3 <= features.FLOW_HEADROOM + 0.01
    assert features.flow_sizing(480, weights, 200, limits)[0] == 200  # more is kept


def test_a_sigterm_ends_a_benchmark_through_its_finally_blocks(tmp_path):
    # A make stopped with SIGTERM passes it to the benchmark: its finally blocks must run
    # (they stop the worker processes and the throwaway cluster), as after Ctrl-C.
    import signal
    import subprocess
    import sys

    cleaned = tmp_path / "cleaned"
    script = (
        "import time\n"
        "from benchmarks.soak.cluster import end_on_sigterm\n"
        "end_on_sigterm()\n"
        "try:\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        "finally:\n"
        f"    open({str(cleaned)!r}, 'w').write('stopped')\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert cleaned.read_text() == "stopped"
