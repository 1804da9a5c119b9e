"""The worker as a real process: command line, signals, crashes and concurrency."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from django_gator.models import Job, JobState, Worker
from tests.conftest import ROOT, wait_for, worker_env, worker_output
from tests.testapp.jobs import Echo, KillsWorker, RecordOnce, Sleep
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def output(proc: subprocess.Popen[bytes]) -> str:
    return worker_output(proc)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-q", "high,0"], "queue weight 0 in 'high,0' must be from 1 to 1000"),
        (["-q", "high,abc"], "queue weight 'abc' in 'high,abc' is not a whole number"),
        (["-q", ",3"], "queue spec ',3' has no queue name"),
        (["-q", "a b"], "invalid queue name 'a b'"),
        (
            ["-q", "my queue,2"],
            "invalid queue name 'my queue': use 1 to 100 letters, digits, '_', '-', '.' or ':'",
        ),
        (["-q", "high", "-q", "high,2"], "queue 'high' is listed twice"),
        (["--concurrency", "0"], "must be at least 1, got 0"),
        (["--concurrency", "many"], "'many' is not a whole number"),
        (["--shutdown-timeout", "-1"], "must be at least 0, got -1"),
        (
            ["--poll-interval", "0"],
            "--poll-interval: must be at least 0.001, got 0 (the range of GATOR_POLL_INTERVAL)",
        ),
        (["--poll-interval", "nan"], "must be at least 0.001, got nan"),
        (["--poll-interval", "soon"], "'soon' is not a number"),
        (["--processes", "0"], "--processes: must be at least 1, got 0"),
        (["--processes", "two"], "--processes: 'two' is not a whole number"),
        (["--max-memory", "abc"], "--max-memory: 'abc' is not a whole number"),
        (["--max-memory", "0"], "--max-memory: must be at least 1, got 0"),
        (["--max-jobs", "0"], "--max-jobs: must be at least 1, got 0"),
        (["--max-jobs", "1.5"], "--max-jobs: '1.5' is not a whole number"),
    ],
)
def test_bad_command_line_exits_2_naming_the_value(args, message):
    proc = subprocess.run(
        [sys.executable, "-m", "django", "gator_worker", *args],
        cwd=ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert Worker.objects.count() == 0


def test_burst_worker_process_drains_and_exits_0(spawn_worker):
    jobs = Echo.dispatch_many([[i] for i in range(20)])

    proc = spawn_worker("--burst", "--concurrency", "3")

    assert proc.wait(timeout=60) == 0, output(proc)
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], state=JobState.SUCCEEDED).count() == 20
    assert Worker.objects.count() == 0  # unregistered on a clean exit


def test_sigterm_lets_running_jobs_finish_then_exits_0(spawn_worker, tmp_path):
    started = tmp_path / "started"
    job = Sleep.dispatch(1.5, label="graceful", started_file=str(started))
    proc = spawn_worker("--concurrency", "2")
    # Started, not only claimed: a claimed job not yet started goes back to waiting.
    wait_for(started.exists)
    queued_after = Echo.dispatch("not started")

    proc.send_signal(signal.SIGTERM)

    assert proc.wait(timeout=30) == 0, output(proc)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert Execution.objects.filter(label="graceful").count() == 1
    # Claimed after the signal or not at all: it must still be runnable, uncharged.
    queued_after.refresh_from_db()
    assert queued_after.state in (JobState.WAITING, JobState.SUCCEEDED)
    if queued_after.state == JobState.WAITING:
        assert queued_after.attempts == 0


def test_a_second_signal_exits_now_and_hands_the_job_back(spawn_worker):
    job = Sleep.dispatch(60, label="interrupted")
    proc = spawn_worker(env={"GATOR_LOG_LEVEL": "INFO"})
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING)

    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    # The first signal handled: the worker waits for its running job.
    wait_for(lambda: "Worker stopping" in output(proc), timeout=10)
    proc.send_signal(signal.SIGINT)

    assert proc.wait(timeout=30) == 0, output(proc)
    assert time.monotonic() - started < 10
    job.refresh_from_db()
    assert job.state == JobState.WAITING
    assert job.attempts == 0  # not charged
    assert Execution.objects.filter(label="interrupted").count() == 0


def test_shutdown_timeout_bounds_the_wait_for_running_jobs(spawn_worker):
    job = Sleep.dispatch(60, label="slow")
    proc = spawn_worker("--shutdown-timeout", "1")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING)

    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)

    assert proc.wait(timeout=30) == 0, output(proc)
    assert time.monotonic() - started < 10
    assert Job.objects.get(pk=job.pk).state == JobState.WAITING


def test_two_worker_processes_never_run_a_job_twice(spawn_worker):
    procs = [spawn_worker("--concurrency", "4") for _ in range(2)]
    wait_for(lambda: Worker.objects.count() == 2)  # both idle and waiting for work
    jobs = RecordOnce.dispatch_many([[f"j{i}"] for i in range(400)])

    wait_for(lambda: not Job.objects.exclude(state=JobState.SUCCEEDED).exists(), timeout=120)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, output(proc)
    # RecordOnce writes (job_id, attempt=0) under a unique key: a second run of any job
    # would fail and leave its row dead.
    assert Job.objects.filter(state=JobState.SUCCEEDED).count() == len(jobs)
    assert Execution.objects.count() == len(jobs)
    per_pid = Execution.objects.values_list("pid", flat=True).distinct()
    assert len(per_pid) == 2, "both workers should have taken part"


def test_a_sigkilled_worker_loses_nothing(spawn_worker):
    job = Sleep.dispatch(30, label="victim")
    victim = spawn_worker()
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING)
    Job.objects.filter(pk=job.pk).update(args=[0.1])  # the rerun is quick

    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    rescuer = spawn_worker()

    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED, timeout=60)
    rescuer.send_signal(signal.SIGTERM)
    assert rescuer.wait(timeout=30) == 0, output(rescuer)
    job.refresh_from_db()
    assert job.rescues == 1
    assert job.attempts == 2  # the lost run counts as an attempt
    assert job.errors[0]["class"] == "django_gator.exceptions.WorkerLost"
    assert Execution.objects.filter(label="victim").count() == 1


def test_a_job_that_kills_its_worker_ends_dead_as_a_poison_pill(spawn_worker):
    pill = KillsWorker.dispatch()
    healthy = Echo.dispatch_many([[i] for i in range(5)])
    env = {"GATOR_MAX_RESCUES": "2"}

    deadline = time.monotonic() + 90
    while Job.objects.get(pk=pill.pk).state != JobState.DEAD:
        assert time.monotonic() < deadline, "the poison pill never went dead"
        proc = spawn_worker("--concurrency", "1", env=env)
        try:
            proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)

    pill.refresh_from_db()
    # The first crash made it a suspect (the worker ran nothing else, but the rescuer
    # cannot know that); the next two, while it ran alone, were its own.
    assert pill.rescues == 3
    assert pill.crashes == 2
    assert "poison pill" in pill.last_error
    assert Job.objects.filter(
        pk__in=[j.pk for j in healthy], state=JobState.SUCCEEDED
    ).count() == len(healthy)


def test_a_long_job_on_a_live_worker_runs_exactly_once(spawn_worker):
    # Runs for twice the heartbeat timeout (3 s in tests) while a second worker is looking
    # for lost jobs: the owner's heartbeat keeps it from being rescued.
    job = Sleep.dispatch(6, label="long")
    owner = spawn_worker("--concurrency", "1")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING)
    watcher = spawn_worker("--concurrency", "1")

    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED, timeout=30)
    for proc in (owner, watcher):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, output(proc)
    job.refresh_from_db()
    assert (job.attempts, job.rescues, job.errors) == (1, 0, None)
    assert Execution.objects.filter(label="long").count() == 1


def test_workers_and_a_web_process_share_the_database_without_errors(spawn_worker, tmp_path):
    # RELIABILITY.md's SQLite scenario, run on every database: two worker processes drain
    # while a web process writes in atomic() blocks that also dispatch. No double claims
    # (RecordOnce's unique ledger key), and no "database is locked" reaches the web side.
    jobs = RecordOnce.dispatch_many([{"label": f"w{i}"} for i in range(300)])
    workers = [spawn_worker("--concurrency", "2") for _ in range(2)]
    web_log = tmp_path / "web.log"
    with web_log.open("wb") as out:
        web = subprocess.Popen(
            [sys.executable, "-m", "tests.web_writer", "200"],
            cwd=ROOT,
            env=worker_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    assert web.wait(timeout=120) == 0, web_log.read_text()

    total = len(jobs) + 200
    wait_for(lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() == total, timeout=120)
    wait_for(lambda: {p.pid for p in workers} <= set(Worker.objects.values_list("pid", flat=True)))
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, output(proc)
    assert Execution.objects.filter(label="web").count() == 200
    assert Execution.objects.exclude(label="web").count() == total
    assert "database is locked" not in "".join(output(p) for p in workers)


def test_a_poison_pill_takes_no_innocent_job_down_with_it(spawn_worker):
    """A job that SIGKILLs its worker, among 50 ordinary jobs on a --concurrency 4 worker
    that is restarted after each crash: the pill ends dead after its own crashes, and every
    ordinary job succeeds, none of them charged a crash (RELIABILITY.md: precise blame)."""
    pill = KillsWorker.dispatch()
    ordinary = Sleep.dispatch_many([[0.05, f"ordinary {i}"] for i in range(50)])
    ids = [j.pk for j in ordinary]
    env = {
        "GATOR_MAX_RESCUES": "2",
        "GATOR_HEARTBEAT_INTERVAL": "0.2",
        "GATOR_HEARTBEAT_TIMEOUT": "1.5",
    }

    def done() -> bool:
        return Job.objects.get(pk=pill.pk).state == JobState.DEAD and Job.objects.filter(
            pk__in=ids, state=JobState.SUCCEEDED
        ).count() == len(ids)

    deadline = time.monotonic() + 120
    crashed = 0
    while not done():
        assert time.monotonic() < deadline, "the pill or the ordinary jobs never finished"
        proc = spawn_worker("--concurrency", "4", env=env)
        while proc.poll() is None and not done() and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, output(proc)
        else:
            assert proc.returncode == -signal.SIGKILL, output(proc)
            crashed += 1

    pill.refresh_from_db()
    assert (pill.state, pill.crashes) == (JobState.DEAD, 2)
    assert crashed == 3  # one beside others (a suspect from then on), two alone
    rows = list(Job.objects.filter(pk__in=ids))
    assert all(row.state == JobState.SUCCEEDED for row in rows)
    assert all(row.crashes == 0 for row in rows)
    # Each ran to its end at least once (those lost with a crash ran again, alone).
    assert all(Execution.objects.filter(job_id=row.pk).exists() for row in rows)
    assert not any(row.suspect for row in rows if row.rescues == 0)
