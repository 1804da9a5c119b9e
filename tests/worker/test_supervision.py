"""The ``--processes`` supervisor watching its workers' lifelines (``worker/beacon.py``): a
frozen worker process is killed and replaced, its jobs rescued, the health file and
``gator_status --check`` saying so meanwhile; a worker killed after healthy work is back
at once, however often; the words of the pipe, and what is not judged a lapse."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from django_gator.models import Job, JobState, Worker
from django_gator.worker import beacon
from django_gator.worker.processes import Child, ProcessSupervisor
from tests.conftest import wait_for, worker_output
from tests.test_health import check
from tests.testapp.jobs import HoldsTheGil, Record
from tests.testapp.models import Execution
from tests.worker.test_processes import START, alive, children_of

TIMEOUT = settings.GATOR_HEARTBEAT_TIMEOUT  # 3 s in the tests
INTERVAL = settings.GATOR_HEARTBEAT_INTERVAL  # 0.5 s


def started(proc: subprocess.Popen[bytes]) -> list[tuple[int, int]]:
    """(slot, pid) of each worker process the supervisor started, in order."""
    found = re.findall(r"Started worker process .* slot=(\d+) pid=(\d+)", worker_output(proc))
    return [(int(slot), int(pid)) for slot, pid in found]


def ran_a_job(proc: subprocess.Popen[bytes], pid: int) -> bool:
    """The supervisor heard that worker process ``pid`` ran a job to its outcome."""
    return f"Worker process ran its first job pid={pid} " in worker_output(proc)


def file_age(path: Path) -> float:
    return time.time() - os.stat(path).st_mtime


@pytest.mark.django_db(transaction=True)
def test_a_frozen_worker_process_is_replaced_and_its_jobs_rescued(spawn_worker, tmp_path):
    alive_file = tmp_path / "gator-alive"
    proc = spawn_worker(
        *("--processes", "2", "--concurrency", "2", "--health-file", str(alive_file)),
        env={"GATOR_LOG_LEVEL": "INFO"},
    )
    wait_for(lambda: len(children_of(proc)) == 2, timeout=START)
    jobs = Record.dispatch_many([["frozen", 0.3]] * 120)
    victim = Worker.objects.get(pid=min(w.pid for w in children_of(proc)))
    wait_for(
        lambda: (
            ran_a_job(proc, victim.pid)
            and Job.objects.filter(reserved_by=victim.id, state=JobState.RUNNING).exists()
        ),
        timeout=START,
    )
    assert check() == (0, "healthy: 2 live workers\n")
    assert file_age(alive_file) < TIMEOUT / 2

    os.kill(victim.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    held = set(
        Job.objects.filter(reserved_by=victim.id, state=JobState.RUNNING).values_list(
            "pk", flat=True
        )
    )
    # Until its heartbeat lapses: --check names it, the health file grows old, and the
    # supervisor kills it. (Samples of a window, not a wait for an event.)
    said, oldest_file, killed_after = "", 0.0, None
    while time.monotonic() - frozen_at < TIMEOUT + 1 or killed_after is None:
        code, text = check()
        if code and "stale" in text:
            said = text
        oldest_file = max(oldest_file, file_age(alive_file))
        if killed_after is None and not alive(victim.pid):
            killed_after = time.monotonic() - frozen_at
        assert time.monotonic() - frozen_at < TIMEOUT + 10, worker_output(proc)
        time.sleep(0.05)

    # Killed within the heartbeat timeout less an interval of its last round's end (at
    # most an interval and a round before the freeze; the supervisor looks every 0.1 s).
    assert killed_after is not None
    assert TIMEOUT - 2 * INTERVAL - 0.3 < killed_after < TIMEOUT + 0.5, killed_after
    assert f"worker {victim.id}: heartbeat " in said
    assert "stale (more than half of GATOR_HEARTBEAT_TIMEOUT, 3 s)" in said
    assert oldest_file > TIMEOUT / 2
    wait_for(lambda: len(started(proc)) == 3, timeout=10)  # at once: it had run jobs
    wait_for(lambda: f"from lost worker={victim.id} " in worker_output(proc), timeout=30)
    out = worker_output(proc)
    killing = re.search(rf"silent for [\d.]+ s .* killing it pid={victim.pid} ", out)
    assert killing, out
    assert re.search(rf"pid={victim.pid} signal=SIGKILL .*starting another in 0\.0s", out), out
    # Dead before its heartbeat lapsed: no rescue ran a job of a live process.
    assert killing.start() < out.index(f"from lost worker={victim.id} ")

    # Its jobs are rescued and finished by the others; each ran once more at most.
    wait_for(lambda: Job.objects.filter(state=JobState.SUCCEEDED).count() == len(jobs), 180)
    assert held
    for job in Job.objects.filter(pk__in=held):
        assert job.rescues == 1, job.errors
        assert "stopped heartbeating" in job.last_error
        assert Execution.objects.filter(job_id=job.pk).exclude(pid=victim.pid).count() == 1
    assert Execution.objects.filter(label="frozen").values("job_id").distinct().count() == len(jobs)

    # Then healthy again: the new process in its slot, the file fresh, --check content.
    wait_for(lambda: check() == (0, "healthy: 2 live workers\n"), timeout=START)
    wait_for(lambda: file_age(alive_file) < TIMEOUT / 2, timeout=START)
    assert victim.pid not in {w.pid for w in children_of(proc)}

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, worker_output(proc)


@pytest.mark.django_db(transaction=True)
def test_a_process_wedged_in_c_code_is_replaced_until_the_job_is_dead(spawn_worker):
    # One rescue allowed: the first wedge makes the job a suspect, the second (alone) dead.
    proc = spawn_worker(
        *("--processes", "2", "--concurrency", "2"),
        env={"GATOR_LOG_LEVEL": "INFO", "GATOR_MAX_RESCUES": "1"},
    )
    wait_for(lambda: len(children_of(proc)) == 2, timeout=START)
    pill = HoldsTheGil.dispatch()
    others = Record.dispatch_many([["beside", 0.05]] * 40)

    try:  # CI timed out here once (2026-11-28, loaded machine): say where the pill was
        wait_for(lambda: Job.objects.get(pk=pill.pk).state == JobState.DEAD, timeout=180)
        wait_for(
            lambda: (
                Job.objects.filter(pk__in=[j.pk for j in others], state=JobState.SUCCEEDED).count()
                == len(others)
            ),
            timeout=180,
        )
    except AssertionError as exc:
        pill.refresh_from_db()
        seen = (
            f"pill {pill.state} rescues={pill.rescues} suspect={pill.suspect} "
            f"isolated={pill.isolated} reserved_by={pill.reserved_by}\n"
            f"others by state: {_states([j.pk for j in others])}\n{_sessions()}"
        )
        raise AssertionError(f"{exc}\n{seen}\n{worker_output(proc)}") from None

    pill.refresh_from_db()
    assert pill.rescues == 2
    assert "likely poison pill" in pill.last_error
    out = worker_output(proc)
    kills = re.findall(r"silent for ([\d.]+) s .* killing it pid=(\d+) ", out)
    assert len(kills) == 2, out
    limit = TIMEOUT - INTERVAL  # the heartbeat timeout less an interval
    # The upper bound leaves the supervisor's look (every 0.1 s) room to be late on a loaded
    # machine: with CI's two test lines on 2 cores one kill came at 3.6 s.
    assert all(limit - 0.05 <= float(silent) < limit + 2 for silent, _ in kills), kills
    for silent, pid in kills:  # dead, and its job rescued
        rescued = re.search(rf"from lost worker=[^ ]*:{pid}:", out)
        assert rescued, out
        # Killed in time (before its heartbeat lapsed), it was dead before any rescue. A
        # late kill (the supervisor's look delayed past the lapse on a loaded machine)
        # may follow the rescue: CI saw that once (2026-11-29, the 6.1 line's run).
        if float(silent) < TIMEOUT - INTERVAL / 2:
            assert out.index(f"killing it pid={pid} ") < rescued.start(), out
    assert "(stopped)" not in out  # running, not stopped: wedged
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, worker_output(proc)


def _states(ids: list[int]) -> dict[str, int]:
    return dict(Counter(Job.objects.filter(pk__in=ids).values_list("state", flat=True)))


def _sessions() -> str:
    """PostgreSQL: the other sessions of the test database, what each does or waits for
    (a worker blocked on a row lock shows here)."""
    if connection.vendor != "postgresql":
        return ""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, application_name, state, wait_event_type, wait_event,"
            " now() - xact_start, left(query, 160) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return "\n".join(" | ".join(str(v) for v in row) for row in cursor.fetchall())


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_after_healthy_work_is_back_at_once_every_time(spawn_worker):
    proc = spawn_worker("--processes", "2", "--concurrency", "2", env={"GATOR_LOG_LEVEL": "INFO"})
    wait_for(lambda: len(started(proc)) == 2, timeout=START)

    delays = []
    for _ in range(10):
        victim = next(pid for slot, pid in reversed(started(proc)) if slot == 0)

        def victim_ran() -> bool:
            if not Job.objects.filter(state=JobState.WAITING).exists():
                Record.dispatch_many([["oom", 0.05]] * 20)
            return ran_a_job(proc, victim)  # noqa: B023 - called in this iteration only

        wait_for(victim_ran, timeout=START, interval=0.1)
        count = len(started(proc))
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: len(started(proc)) > count, timeout=30, interval=0.01)  # noqa: B023
        delays.append(time.monotonic() - killed)
        assert started(proc)[-1][0] == 0

    assert max(delays) < 1.0, delays
    out = worker_output(proc)
    assert len(re.findall(r"signal=SIGKILL .*starting another in 0\.0s", out)) == 10, out
    assert "starting another in 0.5s" not in out

    # Nothing lost: what the killed processes held was rescued and run.
    wait_for(lambda: not Job.objects.exclude(state=JobState.SUCCEEDED).exists(), timeout=120)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, worker_output(proc)


def test_a_start_up_failure_backs_off_and_a_worker_that_ran_a_job_does_not():
    supervisor = ProcessSupervisor(1, [], install_signal_handlers=False)
    child = Child(0, started_at=100.0)
    for _ in range(3):
        supervisor._ended(child, 1, 1, now=child.started_at + 1)
    assert (child.failures, child.restart_at) == (3, child.started_at + 1 + 2.0)

    vitals, write_end = beacon.open_pipe()
    child.vitals = vitals
    sender = beacon.Beacon(write_end)
    sender.send(beacon.BUSY)
    sender.send(beacon.OK)
    vitals.read()
    supervisor._ended(child, 1, -signal.SIGKILL, now=child.started_at + 1)
    assert (child.failures, child.restart_at) == (3 + 1, child.started_at + 1 + 4.0)

    sender.send(beacon.RAN)
    vitals.read()
    supervisor._ended(child, 1, -signal.SIGKILL, now=child.started_at + 1)
    assert (child.failures, child.restart_at) == (0, child.started_at + 1)
    os.close(write_end)
    vitals.close()


def test_the_pipe_carries_whole_words_and_a_full_pipe_never_blocks():
    vitals, write_end = beacon.open_pipe()
    sender = beacon.Beacon(write_end)
    assert vitals.read() == []
    assert vitals.silent_for(time.monotonic()) is None  # not judged before its first word

    os.write(write_end, b"busy\nok\nbu")  # a word cut in two by the reads
    assert vitals.read() == ["busy", "ok"]
    assert not vitals.in_round
    assert vitals.last_ok is not None
    assert abs(vitals.last_ok - time.time()) < 5
    os.write(write_end, b"sy\nnonsense\n")
    assert vitals.read() == ["busy"]
    assert vitals.in_round
    ended = vitals.last_end
    sender.send(beacon.RAN)  # the main thread's: proves no heartbeat round
    assert vitals.read() == ["ran"]
    assert vitals.ran
    assert vitals.last_end == ended

    for _ in range(100_000):  # far more than a pipe holds: dropped, never waited on
        sender.send(beacon.FAILED)
    words = vitals.read()
    assert set(words) == {"failed"}
    assert 0 < len(words) < 100_000
    assert not vitals.in_round
    sender.send(beacon.BYE)
    vitals.read()
    assert vitals.silent_for(time.monotonic()) is None  # leaving: not judged

    os.close(write_end)
    sender.send(beacon.OK)  # its end closed: ignored
    vitals.close()
    vitals.close()  # once only
    with pytest.raises(ValueError, match="--beacon 987: not an open file descriptor"):
        beacon.Beacon(987)


def test_a_silent_process_is_killed_unless_it_waits_on_the_database_with_the_others():
    """The rule, on real processes (``sleep``) and real pipes: silence past the heartbeat
    timeout kills, except inside a round (database work) of a process that is not stopped
    while the database answered no other process's heartbeat since that round began; and
    nobody is judged right after the supervisor's own loop stalled."""
    supervisor = ProcessSupervisor(4, [], install_signal_handlers=False)
    supervisor.silence_limit = 0.2
    senders = []
    for child in supervisor.children:
        child.process = subprocess.Popen(["sleep", "60"])
        child.vitals, write_end = beacon.open_pipe()
        senders.append(beacon.Beacon(write_end))
    waiting, frozen, _witness, stopped = supervisor.children
    processes = [child.process for child in supervisor.children]

    def look(now: float) -> None:
        for child in supervisor.children:
            assert child.process is not None
            supervisor._listen(child, child.process.pid)
        for child in (waiting, frozen, stopped):  # the witness is judged by nobody
            assert child.process is not None
            supervisor._judge(child, child.process, now)

    try:
        # The others' heartbeats answered before (or as) the rounds began: a shared stall.
        for sender, word in zip(senders, ["busy", "ok", "ok", "busy"], strict=True):
            sender.send(word)
        supervisor._last_tick = time.monotonic() + 1.0 - 0.1
        look(time.monotonic() + 1.0)

        assert waiting.process.poll() is None
        assert frozen.process.wait(timeout=10) == -signal.SIGKILL  # silent between rounds
        assert frozen.killed_silent is not None
        assert frozen.killed_silent > 0.2
        assert stopped.process.poll() is None

        os.kill(stopped.process.pid, signal.SIGSTOP)
        wait_for(lambda: beacon.stopped(processes[3].pid), timeout=10)
        supervisor._note_own_stall(time.monotonic() + 5)  # this loop stalled
        look(time.monotonic() + 5)
        assert stopped.process.poll() is None  # nobody judged for two intervals
        supervisor._judge(stopped, stopped.process, time.monotonic() + 6)
        assert stopped.process.wait(timeout=10) == -signal.SIGKILL  # stopped: no excuse

        # The database answers the witness after the waiting round began: its own wait.
        assert waiting.vitals is not None
        waiting.vitals.round_began = time.monotonic() - 1.0
        senders[2].send("ok")
        look(time.monotonic() + 7)  # past the stall's grace
        assert waiting.process.wait(timeout=10) == -signal.SIGKILL
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        for sender, child in zip(senders, supervisor.children, strict=True):
            assert sender.fd is not None
            os.close(sender.fd)
            assert child.vitals is not None
            child.vitals.close()
