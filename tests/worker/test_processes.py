"""``gator_worker --processes N`` as real processes: the supervisor, its workers, signals,
SIGKILL on either, and recycling (``--max-jobs``, ``--max-memory``)."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from django.core.management import load_command_class

from django_gator.models import Job, JobState, Worker
from django_gator.worker import processes
from django_gator.worker.limits import Limits, rss_bytes
from django_gator.worker.processes import Child, ProcessSupervisor, child_arguments
from tests.conftest import wait_for, worker_output
from tests.testapp.jobs import Record, RecordOnce, Sleep
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


#: Seconds to wait for worker processes to start and take jobs: Django's start-up alone
#: has taken 18 s on this shared machine under load.
START = 120


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting for a parent to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def children_of(supervisor: subprocess.Popen[bytes]) -> list[Worker]:
    return list(Worker.objects.filter(supervisor__contains=f":{supervisor.pid}:"))


def started_pids(proc: subprocess.Popen[bytes]) -> list[int]:
    return [int(p) for p in re.findall(r"Started worker process .* pid=(\d+)", worker_output(proc))]


def test_worker_processes_get_the_supervisors_options():
    command = load_command_class("django_gator", "gator_worker")
    parser = command.create_parser("manage.py", "gator_worker")
    given = [
        *("-q", "critical,8", "-q", "default", "--isolate-queue", "default"),
        *("--concurrency", "3", "--burst", "--shutdown-timeout", "2.5"),
        *("--processes", "4", "--max-jobs", "100", "--max-memory", "300", "-v", "2"),
    ]
    options = vars(parser.parse_args(given))

    args = child_arguments(parser, options, ("processes", "settings", "pythonpath"))

    assert "--processes" not in args
    again = vars(parser.parse_args(args))
    keys = ("queues", "concurrency", "burst", "shutdown_timeout", "max_jobs", "max_memory")
    for key in (*keys, "isolate_queues"):
        assert again[key] == options[key], key
    assert again["isolate_queues"] == ["default"]
    assert again["verbosity"] == 2
    assert again["processes"] is None


def test_a_start_up_failure_backs_off_and_a_long_run_does_not():
    supervisor = ProcessSupervisor(1, [], install_signal_handlers=False)
    child = Child(0, started_at=100.0)

    delays = []
    for _ in range(8):
        supervisor._ended(child, 1, 1, now=child.started_at + 1)
        assert child.restart_at is not None
        delays.append(child.restart_at - (child.started_at + 1))
    assert delays == [0.5, 1, 2, 4, 8, 16, 30, 30]

    supervisor._ended(child, 1, -signal.SIGKILL, now=child.started_at + 61)
    assert child.restart_at == child.started_at + 61  # at once, and the count starts again
    assert child.failures == 0
    supervisor._ended(child, 1, processes.EXIT_RECYCLED, now=child.started_at + 1)
    assert (child.failures, child.restart_at) == (0, child.started_at + 1)


def test_the_supervisor_restarts_a_sigkilled_worker_and_every_job_succeeds(spawn_worker):
    proc = spawn_worker("--processes", "2", "--concurrency", "2", env={"GATOR_LOG_LEVEL": "INFO"})
    wait_for(lambda: len(children_of(proc)) == 2, timeout=START)
    first = {w.pid for w in children_of(proc)}
    jobs = Record.dispatch_many([["restart", 0.05]] * 200)
    victim = Worker.objects.get(pid=min(first))
    wait_for(
        lambda: Job.objects.filter(reserved_by=victim.id, state=JobState.RUNNING).exists(),
        timeout=START,
    )

    os.kill(victim.pid, signal.SIGKILL)

    wait_for(lambda: len({w.pid for w in children_of(proc)} - first) == 1, timeout=START)
    wait_for(lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() == len(jobs), timeout=180)
    assert f"pid={victim.pid} signal=SIGKILL" in worker_output(proc)
    # Every job ran; a second run only for what the killed worker had in flight.
    runs = Execution.objects.filter(label="restart")
    assert set(runs.values_list("job_id", flat=True)) == {j.pk for j in jobs}
    assert runs.count() - len(jobs) <= 2  # its two threads
    rerun = {j for j, a in runs.values_list("job_id", "attempt") if a > 1}
    assert rerun == set(Job.objects.filter(rescues=1).values_list("pk", flat=True))

    pids = {w.pid for w in children_of(proc)}
    proc.send_signal(signal.SIGTERM)

    assert proc.wait(timeout=60) == 0, worker_output(proc)
    assert not [pid for pid in pids if alive(pid)]
    assert Worker.objects.count() == 0  # each worker process unregistered as it stopped


def test_sigterm_lets_every_worker_finish_its_job_and_exits_0(spawn_worker, tmp_path):
    started = [tmp_path / f"started-{i}" for i in range(2)]
    jobs = [Sleep.dispatch(1.5, label="drain", started_file=str(path)) for path in started]
    proc = spawn_worker("--processes", "2", "--concurrency", "1")
    wait_for(lambda: all(path.exists() for path in started), timeout=START)
    pids = {w.pid for w in children_of(proc)}
    assert len(pids) == 2  # one job in each process

    proc.send_signal(signal.SIGTERM)

    assert proc.wait(timeout=60) == 0, worker_output(proc)
    assert all(Job.objects.get(pk=j.pk).state == JobState.SUCCEEDED for j in jobs)
    assert Execution.objects.filter(label="drain").count() == 2
    assert not [pid for pid in pids if alive(pid)]


def test_a_second_signal_to_the_supervisor_stops_the_workers_now(spawn_worker):
    job = Sleep.dispatch(60, label="interrupted")
    proc = spawn_worker("--processes", "2", env={"GATOR_LOG_LEVEL": "INFO"})
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, timeout=START)
    pids = {w.pid for w in children_of(proc)}

    begun = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    # The first signal passed on: the worker running the job waits for it.
    wait_for(lambda: re.search(r"Worker stopping .* running=1 ", worker_output(proc)), timeout=10)
    proc.send_signal(signal.SIGINT)

    assert proc.wait(timeout=30) == 0, worker_output(proc)
    assert time.monotonic() - begun < 15  # not the 60 s job, nor the shutdown timeout
    job.refresh_from_db()
    assert (job.state, job.attempts) == (JobState.WAITING, 0)  # handed back, not charged
    assert not [pid for pid in pids if alive(pid)]


def test_a_sigkilled_supervisor_leaves_no_worker_running(spawn_worker):
    proc = spawn_worker("--processes", "2")
    wait_for(lambda: len(children_of(proc)) == 2, timeout=START)
    pids = [w.pid for w in children_of(proc)]

    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)

    wait_for(lambda: not any(alive(pid) for pid in pids), timeout=30)
    # They stopped as on SIGTERM: rows removed, nothing left running.
    assert Worker.objects.count() == 0


def test_max_jobs_recycles_workers_and_runs_every_job_exactly_once(spawn_worker):
    jobs = RecordOnce.dispatch_many([[f"r{i}"] for i in range(1000)])

    proc = spawn_worker(
        "--processes", "2", "--concurrency", "4", "--max-jobs", "100", "--burst",
        env={"GATOR_LOG_LEVEL": "INFO"},
    )  # fmt: skip

    assert proc.wait(timeout=300) == 0, worker_output(proc)
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == len(jobs)
    # RecordOnce's ledger key is (job id, 0): a second run of any job would have failed.
    assert Execution.objects.count() == len(jobs)
    per_process = Execution.objects.values_list("pid", flat=True)
    counts = {pid: list(per_process).count(pid) for pid in set(per_process)}
    assert len(counts) >= 10
    assert max(counts.values()) <= 100
    assert len(started_pids(proc)) >= 10
    assert "reason=max-jobs 100" in worker_output(proc)
    assert Worker.objects.count() == 0


def test_one_supervised_process_is_recycled_not_ended(spawn_worker):
    """--processes 1 with a recycling option: one worker process at a time, replaced each
    time it recycles (without --processes, the worker exits: see the next test)."""
    jobs = RecordOnce.dispatch_many([[f"one{i}"] for i in range(12)])

    proc = spawn_worker(
        "--processes", "1", "--concurrency", "2", "--max-jobs", "5", "--burst",
        env={"GATOR_LOG_LEVEL": "INFO"},
    )  # fmt: skip

    assert proc.wait(timeout=120) == 0, worker_output(proc)
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == len(jobs)
    assert Execution.objects.count() == len(jobs)
    assert len(set(Execution.objects.values_list("pid", flat=True))) >= 3
    assert "processes=1" in worker_output(proc)  # "Supervisor started ... processes=1"


def test_a_worker_on_its_own_exits_after_max_jobs(spawn_worker):
    jobs = RecordOnce.dispatch_many([[f"s{i}"] for i in range(12)])

    proc = spawn_worker("--concurrency", "4", "--max-jobs", "5")  # not --burst: it would wait

    assert proc.wait(timeout=60) == 0, worker_output(proc)
    assert Execution.objects.count() == 5
    done = Job.objects.filter(pk__in=[j.pk for j in jobs], state=JobState.SUCCEEDED).count()
    assert done == 5
    # The others were never claimed: waiting, no attempt charged.
    assert Job.objects.filter(state=JobState.WAITING, attempts=0).count() == 7


def test_a_worker_past_max_memory_finishes_its_jobs_and_exits(spawn_worker):
    jobs = RecordOnce.dispatch_many([[f"m{i}"] for i in range(20)])

    proc = spawn_worker("--max-memory", "1", env={"GATOR_LOG_LEVEL": "INFO"})

    assert proc.wait(timeout=60) == 0, worker_output(proc)
    assert "reason=max-memory" in worker_output(proc)
    # Nothing lost, nothing run twice: each job ran once, or is waiting uncharged.
    ran = set(Execution.objects.values_list("job_id", flat=True))
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        if job.pk in ran:
            assert job.state == JobState.SUCCEEDED
        else:
            assert (job.state, job.attempts) == (JobState.WAITING, 0)


def test_workers_that_fail_at_start_up_are_started_again_with_a_pause(spawn_worker, tmp_path):
    # A database without django-gator's tables: each worker process exits 1 at start-up.
    empty = tmp_path / "empty.sqlite3"
    proc = spawn_worker(
        "--processes", "2", env={"DATABASE_URL": f"sqlite:///{empty}", "GATOR_LOG_LEVEL": "INFO"}
    )
    wait_for(lambda: "starting another in 1.0s" in worker_output(proc), timeout=180)

    proc.send_signal(signal.SIGTERM)

    assert proc.wait(timeout=60) == 0, worker_output(proc)
    out = worker_output(proc)
    assert "starting another in 0.5s" in out
    assert "starting another in 1.0s" in out
    assert "django_gator tables are missing" in out or "migrate" in out


def test_limits_watch_memory_once_a_second_and_the_parent():
    now = [0.0]
    rss = [10 * 1024 * 1024]
    limits = Limits(max_memory_mb=50, memory=lambda: rss[0], clock=lambda: now[0])

    assert limits.over_memory() is None
    rss[0] = 60 * 1024 * 1024
    now[0] = 0.5
    assert limits.over_memory() is None  # not looked at again yet
    now[0] = 1.0
    assert limits.over_memory() == "max-memory rss=60MiB limit=50MiB"
    assert not limits.orphaned()
    assert Limits(supervisor_pid=os.getppid()).orphaned() is False
    assert Limits(supervisor_pid=os.getpid()).orphaned() is True
    assert rss_bytes() > 1024 * 1024


def test_supervisor_ids_name_a_pid():
    assert processes.supervisor_pid("web-1.example:4242:ab12cd34") == 4242
    with pytest.raises(ValueError, match="'nonsense' is not HOST:PID:TOKEN"):
        processes.supervisor_pid("nonsense")


def test_hidden_supervisor_option_is_not_in_the_help():
    command = load_command_class("django_gator", "gator_worker")
    parser = command.create_parser("manage.py", "gator_worker")
    text = parser.format_help()
    assert "--processes" in text
    assert "--max-memory" in text
    assert "--supervisor" not in text
    assert isinstance(parser, argparse.ArgumentParser)
