"""How the conversion benchmark (benchmarks/conversion) judges a run and splits it into
phases: plain functions on the dispatch records and the jobs' rows."""

from __future__ import annotations

from benchmarks.conversion.__main__ import phase_bounds, phases, steps, verdict

# Each dispatched job's row: state, attempts, rescues, created (epoch s), started.
ROWS = {1: ("succeeded", 1, 0, 100.0, 100.001), 2: ("succeeded", 1, 0, 100.5, 100.502)}
RECORDS = [{"at": 100.0, "s": 0.001, "id": 1}, {"at": 100.5, "s": 0.002, "id": 2}]


def test_a_run_where_every_job_ran_once_passes():
    result = verdict(RECORDS, ROWS, loaded=10, total=12, in_default=0)
    assert result["passed"], result


def test_a_lost_job_a_second_run_or_a_missing_row_fails():
    lost = verdict(RECORDS, {1: ROWS[1]}, loaded=10, total=11, in_default=0)
    assert (lost["missing"], lost["passed"]) == (1, False)
    twice = verdict(
        RECORDS, {**ROWS, 2: ("succeeded", 2, 1, 100.5, 101.0)}, loaded=10, total=12, in_default=0
    )
    assert (twice["attempts_over_1"], twice["rescues"], twice["passed"]) == (1, 1, False)
    unfinished = verdict(
        RECORDS, {**ROWS, 2: ("waiting", 0, 0, 100.5, None)}, 10, total=12, in_default=0
    )
    assert (unfinished["not_succeeded"], unfinished["passed"]) == (1, False)
    assert not verdict(RECORDS, ROWS, loaded=10, total=11, in_default=0)["passed"]
    assert not verdict(RECORDS, ROWS, loaded=10, total=12, in_default=1)["passed"]
    failed = verdict([*RECORDS, {"at": 101.0, "s": 0.1, "error": "x"}], ROWS, 10, 12, 0)
    assert (failed["dispatch_errors"], failed["passed"]) == (1, False)


EVENTS = [
    (10.0, "start"),
    (11.0, "built django_gator_job_new and its partitions"),
    (11.5, "mirroring writes into the new table"),
    (12.0, "copied ids up to 10 of 20 (10 rows)"),
    (13.0, "copied ids up to 20 of 20 (20 rows)"),
    (13.5, "checking the copy"),
    (14.0, "swapping the tables"),
    (14.1, "swapped in 100 ms (lock waits included)"),
    (14.1, "done"),
]


def test_the_steps_and_the_phases_come_from_the_conversion_s_messages():
    found = steps(EVENTS)
    assert found["batches"] == 2
    assert found["batch_max_s"] == 1.0
    assert (found["build_s"], found["copy_s"], found["check_s"]) == (1.0, 2.0, 0.5)
    bounds = phase_bounds(EVENTS, began=5.0, ended=20.0)
    assert bounds["before"] == (5.0, 10.0)
    assert bounds["copy"] == (11.5, 13.5)
    assert bounds["swap"] == (14.0, 14.1)
    assert bounds["after"] == (14.1, 20.0)


def test_a_pause_of_the_claims_across_the_swap_is_its_gap():
    # Jobs dispatched before and after a swap that held claims from 14.0 to 14.1: the gap
    # between the starts around it overlaps the swap, though no job started inside it.
    rows = {
        1: ("succeeded", 1, 0, 13.9, 13.95),
        2: ("succeeded", 1, 0, 14.05, 14.12),
        3: ("succeeded", 1, 0, 14.2, 14.201),
    }
    records = [{"at": rows[i][3], "s": 0.001, "id": i} for i in rows]
    found = phases(records, rows, phase_bounds(EVENTS, began=5.0, ended=20.0))
    assert found["swap"]["longest_gap_between_starts_ms"] == 170.0
    assert found["swap"]["pickup"]["n"] == 1
    assert found["swap"]["pickup"]["max_ms"] == 70.0
    assert found["after"]["pickup"]["max_ms"] == 1.0
