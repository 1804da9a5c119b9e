"""How the fleet benchmark judges its steps (benchmarks/fleet): the checks against a
throughput fall and an unbounded claim p99, the backlog's growth, the ceiling's verdict,
and the connections it counts per worker process. Plain functions on step records."""

from __future__ import annotations

from argparse import Namespace

import pytest

from benchmarks.fleet import ceiling, netns, series
from benchmarks.fleet.main import main as fleet_main
from benchmarks.fleet.main import numbers, outputs, parser

OPTIONS = Namespace(max_fall=0.10, claim_p99_max=250.0)


def step(processes: int, throughput: float, p99: float | None = 20.0) -> dict:
    return {"processes": processes, "throughput": throughput, "claim": {"p99_ms": p99}}


def test_a_fall_of_more_than_a_tenth_below_a_smaller_fleet_fails():
    steps = [step(1, 1000), step(2, 1500), step(4, 1400), step(8, 1340), step(12, 1360)]
    found = series.checks(steps, OPTIONS)
    assert [(c["check"], c["processes"]) for c in found] == [("throughput fell", 8)]
    assert "1,340 jobs/s against 1,500" in found[0]["detail"]


def test_a_flat_or_rising_curve_and_bounded_claims_pass():
    steps = [step(1, 1000), step(2, 1500), step(4, 1400), step(8, 1351), step(12, 1600)]
    assert series.checks(steps, OPTIONS) == []


def test_a_claim_p99_over_its_bound_or_missing_fails():
    found = series.checks([step(1, 1000, 251.0), step(2, 1100, None)], OPTIONS)
    assert [(c["check"], c["processes"]) for c in found] == [("claim p99", 1), ("claim p99", 2)]


def test_the_backlog_slope():
    assert ceiling.slope([(0, 10), (2, 10), (4, 10)]) == 0
    assert ceiling.slope([(0, 0), (2, 60), (4, 120), (6, 180)]) == pytest.approx(30)
    assert ceiling.slope([(0, 5), (2, 7)]) == 0  # too few points to say


def watched(busy: float, waits: dict[str, float], cores: dict[str, float]) -> dict:
    return {
        "host_busy_share": busy,
        "wait_shares": waits,
        "cores_by_role": cores,
        "disks": {"vda": {"busy_share": 0.1}},
        "server_per_s": {"wal_sync_per_s": 90.0},
    }


@pytest.mark.parametrize(
    ("sent", "busy", "waits", "starts"),
    [
        (900.0, 0.5, {"CPU": 1.0}, "dispatcher: sent 900/s of 1,000/s"),
        (1000.0, 0.95, {"CPU": 1.0}, "CPU: the machine 95% busy"),
        (1000.0, 0.5, {"Lock:transactionid": 0.2, "LWLock:WALInsert": 0.15}, "locks: 35%"),
        (1000.0, 0.5, {"IO:WALSync": 0.4, "CPU": 0.6}, "WAL/fsync I/O: 40%"),
        # Waiting for another backend's WAL flush is I/O, not a lock held by a peer.
        (1000.0, 0.5, {"LWLock:WALWrite": 0.25, "IO:WALSync": 0.1}, "WAL/fsync I/O: 35%"),
        (1000.0, 0.5, {"LWLock:WALWrite": 0.25, "Lock:tuple": 0.1}, "none of CPU (50%)"),
        (1000.0, 0.5, {"CPU": 0.9, "IO:WALSync": 0.1}, "none of CPU (50%)"),
    ],
)
def test_the_ceiling_names_what_ran_out(sent, busy, waits, starts):
    cores = {"w1@db": 0.4, "backend:w1@db": 0.3, "dispatcher": 0.1}
    record = {"sent_per_s": sent, "watch": watched(busy, waits, cores)}
    record["cores_by_group"] = ceiling.groups(cores)
    assert ceiling.verdict(record, 1000.0).startswith(starts)


def test_cores_are_grouped_by_kind_of_process():
    cores = {
        "w1@h1": 0.2,
        "w2@h2": 0.3,
        "backend:w1@h1": 0.25,
        "backend:dispatcher": 0.05,
        "pg:walwriter": 0.01,
        "pgbouncer": 0.04,
    }
    assert ceiling.groups(cores) == {
        "worker processes": 0.5,
        "worker sessions (PostgreSQL)": 0.25,
        "dispatcher session (PostgreSQL)": 0.05,
        "pgbouncer": 0.04,
        "pg:walwriter": 0.01,
    }


def test_connections_per_process_directly_and_through_pgbouncer():
    direct = {
        "sessions": {"w1@h1@10.231.1.2": 9, "w2@h2@10.231.2.2": 9, "dispatcher@127.0.0.1": 1},
        "worker_sessions_by_client": {},
    }
    found = series.connections(direct, [], 2)
    assert found["server_per_process"] == {"min": 9, "max": 9, "mean": 9.0}
    assert found["pgbouncer_clients_per_process"] is None
    pooled = {
        "sessions": {
            "w1@h1@127.0.0.1": 5,
            "w1@h1-listen@10.231.1.2": 1,
            "w2@h2@127.0.0.1": 4,
            "w2@h2-listen@10.231.2.2": 1,
        },
        "worker_sessions_by_client": {"127.0.0.1": 8},
    }
    clients = [{"application_name": f"gator-fleet-w{i % 2 + 1}@h{i % 2 + 1}"} for i in range(16)]
    found = series.connections(pooled, clients, 2)
    assert found["server_per_process"] is None  # the pool's sessions belong to no process
    assert found["listen_per_process"] == {"min": 1, "max": 1, "mean": 1.0}
    assert found["pgbouncer_server_sessions"] == 8
    assert found["pgbouncer_clients_per_process"] == {"min": 8, "max": 8, "mean": 8.0}


def test_bad_lists_and_fleet_sizes_are_refused_by_name():
    with pytest.raises(Exception, match="'1,x'"):
        numbers(int, "1,x")
    with pytest.raises(Exception, match="'0,2'"):
        numbers(int, "0,2")
    with pytest.raises(ValueError, match="not 0"):
        netns.Network(0)
    assert netns.Network(3).host_of("10.231.2.2") == "h2"


@pytest.mark.parametrize("given", [["--part", "all"], ["--part", "fleet", "--modes", "both"]])
def test_the_control_worker_runs_the_direct_fleet_only(given):
    """The control (rawworker.py) stands in for gator_worker in the direct fleet's steps;
    asked for elsewhere it is refused before anything starts, saying what to give."""
    with pytest.raises(SystemExit, match="--part fleet --modes direct"):
        fleet_main(["--worker", "raw", *given])


def test_the_control_reports_beside_the_fleet_not_over_it():
    control = outputs(parser().parse_args(["--worker", "raw", "--part", "fleet"]))
    fleet = outputs(parser().parse_args(["--part", "fleet"]))
    assert (control.out.name, control.chart.name) == ("fleet-control.json", "fleet-control.png")
    assert (fleet.out.name, fleet.chart.name) == ("fleet.json", "fleet.png")
    given = outputs(parser().parse_args(["--worker", "raw", "--out", "/tmp/x.json"]))
    assert str(given.out) == "/tmp/x.json"
