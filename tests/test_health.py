"""Health: ``gator_status --check`` against real workers (SIGKILLed and started again),
the health file a worker touches at each heartbeat, and their bad input."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_gator import pause_queue
from django_gator.models import Job, Worker
from tests.conftest import ROOT, stop_worker, wait_for, worker_env
from tests.testapp.jobs import Noop, Sleep

pytestmark = pytest.mark.django_db(transaction=True)


def status(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "gator_status", *args],
        cwd=ROOT,
        env=worker_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def check(*args: str) -> tuple[int, str]:
    """``gator_status --check`` in this process: (exit code, what it said)."""
    out = io.StringIO()
    try:
        call_command("gator_status", "--check", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, str(exc)
    return 0, out.getvalue()


def live(pid: int) -> bool:
    return Worker.objects.filter(pid=pid).exists()


def test_check_is_1_when_the_only_worker_is_killed_and_0_when_one_is_back(spawn_worker):
    first = spawn_worker("-q", "health")
    wait_for(lambda: live(first.pid), timeout=60)
    first_id = Worker.objects.get(pid=first.pid).id
    healthy = status("--check")  # once as a command line: the exit code itself
    assert healthy.returncode == 0, healthy.stderr
    assert "healthy: 1 live worker" in healthy.stdout

    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    # Its row stays until its heartbeat lapses (GATOR_HEARTBEAT_TIMEOUT, 3 s in the tests);
    # from half that on, the worker is stale: live, but not heartbeating.
    wait_for(lambda: check()[0] != 0, timeout=30, interval=0.1)
    code, said = check()
    assert code == 1
    assert said.startswith(f"unhealthy: worker {first_id}: heartbeat ") or (
        "no live worker" in said
    )
    wait_for(lambda: "no live worker" in check()[1], timeout=30, interval=0.1)
    code, said = check()
    assert code == 1
    sick = status("--check")
    assert sick.returncode == 1, sick.stdout + sick.stderr
    assert "no live worker" in sick.stderr

    second = spawn_worker("-q", "health")
    wait_for(lambda: live(second.pid), timeout=60)
    assert check() == (0, "healthy: 1 live worker\n")
    stop_worker(second)


def test_check_names_a_frozen_worker_stale_and_is_0_again_once_it_resumes(spawn_worker):
    job = Sleep.dispatch(120, label="held")
    worker = spawn_worker()
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "running", timeout=60)
    worker_id = Worker.objects.get(pid=worker.pid).id
    assert check() == (0, "healthy: 1 live worker\n")

    worker.send_signal(signal.SIGSTOP)
    # Stale past half of GATOR_HEARTBEAT_TIMEOUT (1.5 s of 3 s): still live, so not
    # "no live worker", and its job not rescued yet.
    answers: list[tuple[int, str]] = []
    wait_for(lambda: answers.append(check()) or answers[-1][0] == 1, timeout=30, interval=0.05)
    worker.send_signal(signal.SIGCONT)
    said = answers[-1][1]

    assert said.startswith(f"unhealthy: worker {worker_id}: heartbeat "), said
    assert "stale (more than half of GATOR_HEARTBEAT_TIMEOUT, 3 s)" in said
    assert said.endswith("it holds 1 running job")
    wait_for(lambda: check() == (0, "healthy: 1 live worker\n"), timeout=30)
    assert Job.objects.get(pk=job.pk).reserved_by == worker_id


def test_check_names_a_queue_whose_oldest_due_job_waited_too_long(spawn_worker):
    worker = spawn_worker("-q", "elsewhere")
    wait_for(lambda: live(worker.pid), timeout=60)
    job = Noop.dispatch(queue="unserved")
    Noop.dispatch(queue="held")
    Job.objects.filter(queue__in=["unserved", "held"]).update(
        next_execution_at=timezone.now() - timedelta(seconds=120)
    )
    pause_queue("held")  # a paused queue's jobs wait on purpose
    assert check()[0] == 0  # no latency limit asked for
    assert check("--max-latency", "600")[0] == 0
    code, said = check("--max-latency", "60")
    assert code == 1
    assert "queue 'unserved'" in said
    assert "more than --max-latency 60" in said
    assert "held" not in said
    code, said = check("--min-workers", "2")
    assert code == 1
    assert "1 live workers, fewer than --min-workers 2" in said
    assert Job.objects.get(pk=job.pk).state == "waiting"
    stop_worker(worker)


def test_check_is_1_when_the_database_is_unreachable():
    # Nothing listens on port 1: the connection is refused.
    down = status("--check", DATABASE_URL="postgres://postgres@127.0.0.1:1/nothing")
    assert down.returncode == 1, down.stdout + down.stderr
    assert "database 'default' unreachable" in down.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--check", "--max-latency", "-1"], "--max-latency"),
        (["--check", "--min-workers", "-2"], "--min-workers"),
    ],
)
def test_check_refuses_bad_values_with_exit_2(args, message):
    result = status(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr


def test_the_health_file_is_touched_at_every_heartbeat(spawn_worker, tmp_path):
    alive = tmp_path / "gator-alive"
    worker = spawn_worker("--health-file", str(alive))
    wait_for(alive.exists, timeout=60)
    first = os.stat(alive).st_mtime_ns
    # Heartbeats every 0.5 s in the tests.
    wait_for(lambda: os.stat(alive).st_mtime_ns > first, timeout=10)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    last = os.stat(alive).st_mtime_ns
    time.sleep(1.5)  # deliberate: three heartbeats' time, and nothing touches the file
    assert os.stat(alive).st_mtime_ns == last


def test_latency_and_workers_options_need_check():
    with pytest.raises(CommandError, match="go with --check") as raised:
        call_command("gator_status", "--max-latency", "60")
    assert raised.value.returncode == 2
