"""Wakeups without LISTEN (SQLite, MariaDB/MySQL, PostgreSQL with ``GATOR_NOTIFY = False``):
workers publish a UDP address, dispatch sends a datagram after its commit, and neither a
dead address nor a lost datagram ever delays or fails a dispatch."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

from django_gator import conf, wakeup
from django_gator.conf import InvalidSetting
from django_gator.engines import get_engine
from django_gator.models import Job, JobState, Worker
from django_gator.worker.listener import bind_wakeup_socket
from django_gator.worker.supervisor import WorkerProcess
from tests.conftest import wait_for
from tests.testapp.jobs import Echo

pytestmark = pytest.mark.django_db(transaction=True)

#: The datagram tests run on every database: on PostgreSQL with its NOTIFY turned off.
datagrams = pytest.mark.usefixtures("without_notify")


@pytest.fixture
def without_notify() -> Iterator[None]:
    with override_settings(GATOR_NOTIFY=False):
        yield


@pytest.fixture(autouse=True)
def fresh_directory() -> Iterator[None]:
    wakeup.forget()
    yield
    wakeup.forget()


def register(worker_id: str, address: str, queues: list[str] | None = None) -> None:
    get_engine(connection.alias).register_worker(
        worker_id,
        socket.gethostname(),
        1,
        json.dumps([[q, 1] for q in queues or []]),
        1,
        wakeup_address=address,
    )


def dead_address() -> str:
    """A local UDP port nobody reads: bound, then closed."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"127.0.0.1:{port}"


@pytest.fixture
def inbox() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(2.0)
    yield sock
    sock.close()


def address_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()
    return f"{host}:{port}"


def received(sock: socket.socket, timeout: float) -> list[set[str] | None]:
    sock.settimeout(timeout)
    got = []
    try:
        while True:
            got.append(wakeup.decode(sock.recv(2048)))
            sock.settimeout(0.05)
    except TimeoutError:
        return got


@datagrams
@override_settings(GATOR_HEARTBEAT_TIMEOUT=300)  # the rows stay "live" however slow the run
def test_dispatch_neither_fails_nor_waits_when_registered_workers_are_gone():
    # Workers that died without removing their rows: a closed local port (the kernel
    # answers with ICMP "port unreachable", which Linux reports on the socket's next
    # sendto as ConnectionRefusedError), an address on a documentation network that routes
    # nowhere, and one that is not an address at all.
    for index in range(5):
        register(f"dead-{index}", dead_address())
    register("dead-net", "192.0.2.1:9")
    register("dead-garbage", "not an address")
    wakeup.refresh(connection.alias)

    # The cost of a dispatch with those rows in the directory, against one without any
    # wakeup, in the same run: several hundred each, interleaved.
    def timed(n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            Echo.dispatch(i)
        return time.perf_counter() - start

    with override_settings(GATOR_WAKEUP_BIND=None):
        timed(20)
    timed(20)
    plain = woken = 0.0
    for _ in range(3):
        with override_settings(GATOR_WAKEUP_BIND=None):
            plain += timed(100)
        woken += timed(100)
    assert Job.objects.filter(name=Echo.name, state=JobState.WAITING).count() == 640
    # Seven sendto calls (and one directory read a second) per dispatch: far less than
    # the INSERT itself. A generous bound, as the machine is shared.
    assert woken < plain * 2 + 0.5, (woken, plain)
    # Every dead row was in the directory the dispatches sent to (the garbage one skipped).
    sent = wakeup.send(connection.alias, {"echo"})
    directory = wakeup.Directory(connection.alias)
    directory.refresh(close=False)
    assert len(directory.targets) == 6
    assert 0 <= sent <= 6


@datagrams
def test_a_datagram_reaches_the_workers_of_the_queue_after_commit(inbox):
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    try:
        register("of-echo", address_of(inbox), ["echo"])
        register("of-other", address_of(other), ["other"])
        wakeup.refresh(connection.alias)
        with transaction.atomic():
            Echo.dispatch(1)
            assert received(inbox, 0.2) == []  # not before the commit
        assert received(inbox, 2.0) == [{"echo"}]
        assert received(other, 0.2) == []

        with transaction.atomic():
            Echo.dispatch(2)
            transaction.set_rollback(True)
        assert received(inbox, 0.3) == []  # rolled back: nothing to wake for

        Echo.dispatch(3, wait=60)  # not due: no wakeup either
        assert received(inbox, 0.3) == []
        Echo.dispatch_many([[4], [5]], queue="other")
        assert received(other, 2.0) == [{"other"}]
    finally:
        other.close()


@datagrams
def test_another_hosts_loopback_address_and_stale_rows_are_skipped(inbox):
    get_engine(connection.alias).register_worker(
        "elsewhere", "another-host", 1, "[]", 1, wakeup_address=address_of(inbox)
    )
    register("stale", address_of(inbox))
    Worker.objects.filter(id="stale").update(
        heartbeat_at=Worker.objects.get(id="stale").heartbeat_at.replace(year=2000)
    )
    wakeup.refresh(connection.alias)
    assert wakeup.send(connection.alias, {"echo"}) == 0
    assert received(inbox, 0.3) == []


@contextlib.contextmanager
def polling_worker() -> Iterator[WorkerProcess]:
    """A worker whose poll interval is 30 s (only a wakeup can start a job within
    seconds), registered; stopped and its row gone at the end."""
    worker = WorkerProcess(concurrency=2, poll_interval=30, install_signal_handlers=False)

    def run() -> None:
        try:
            worker.run()
        finally:
            connections.close_all()  # this thread's, which removed the worker's row

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for(lambda: Worker.objects.filter(id=worker.worker_id).exists(), timeout=20)
        yield worker
    finally:
        worker.request_stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert not Worker.objects.filter(id=worker.worker_id).exists()


def started_soon(worker: WorkerProcess, *args: object) -> None:
    """Dispatch once the worker is idle (its last claim found nothing: it waits 30 s for
    a poll), and see the job done within 10 s."""
    assert worker.slots.idle.wait(20), "the worker never went idle"
    started = time.monotonic()
    job = Echo.dispatch(*args)
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED, timeout=20)
    assert time.monotonic() - started < 10, "started by the worker's poll, not a wakeup"


@datagrams
def test_an_idle_worker_starts_a_job_long_before_its_next_poll():
    with polling_worker() as worker:
        row = Worker.objects.get(id=worker.worker_id)
        assert row.wakeup_address == worker.registration.wakeup_address
        assert row.wakeup_address.startswith("127.0.0.1:")
        wakeup.refresh(connection.alias)
        for i in range(3):
            started_soon(worker, i)


@datagrams
def test_a_processs_first_dispatch_wakes_an_idle_worker():
    # Before, the first dispatch of a process found its list of workers not read yet
    # (it is read in the background), sent nothing, and the job waited for a poll.
    with polling_worker() as worker:
        assert worker.slots.idle.wait(20), "the worker never went idle"
        wakeup.forget()  # as in a process that has not dispatched yet
        started_soon(worker, "first")


@override_settings(GATOR_NOTIFY=True)  # the default (the suite may run with it off)
def test_postgresql_workers_publish_no_address_and_off_means_off():
    with override_settings(GATOR_WAKEUP_BIND=None):
        assert not wakeup.enabled(connection.alias)
        worker = WorkerProcess(concurrency=1, install_signal_handlers=False)
        worker._bind_wakeups()
        assert worker.registration.wakeup_socket is None
    worker = WorkerProcess(concurrency=1, install_signal_handlers=False)
    worker._bind_wakeups()
    try:
        assert (worker.registration.wakeup_socket is None) == (connection.vendor == "postgresql")
        # LISTEN or a wakeup socket: no quick polls either way.
        assert worker.fetcher.listening
    finally:
        if worker.registration.wakeup_socket is not None:
            worker.registration.wakeup_socket.close()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="NOTIFY is PostgreSQL's")
def test_without_notify_postgresql_wakes_workers_with_datagrams_only(inbox, pg_listener):
    from django_gator.engines.postgresql_copy import COPY_MIN_ROWS

    engine = get_engine(connection.alias)

    def notified(timeout: float) -> list[str]:
        return [n.payload for n in pg_listener.notifies(timeout=timeout, stop_after=1)] + [
            n.payload for n in pg_listener.notifies(timeout=0)
        ]

    register("of-echo", address_of(inbox), ["echo"])
    with override_settings(GATOR_NOTIFY=False):
        assert not engine.notifies
        assert wakeup.enabled(connection.alias)
        wakeup.refresh(connection.alias)
        # Every way a due job is inserted, and a wake of its own (a resume, a signal):
        Echo.dispatch(1)  # the single INSERT
        Echo.dispatch_many([[2], [3]])  # INSERT ... unnest()
        Echo.dispatch_many([[i] for i in range(COPY_MIN_ROWS)])  # COPY
        engine.wake(["echo"])
        assert received(inbox, 2.0) == [{"echo"}] * 4
        with transaction.atomic():
            Echo.dispatch(4)
            assert received(inbox, 0.2) == []  # not before the commit
        assert received(inbox, 2.0) == [{"echo"}]
        assert notified(0.5) == []
        # A worker binds a wakeup socket and does not LISTEN.
        worker = WorkerProcess(concurrency=1, install_signal_handlers=False)
        worker._bind_wakeups()
        try:
            assert worker.listen_on is None
            assert worker.registration.wakeup_socket is not None
            assert worker.fetcher.listening
        finally:
            worker.registration.wakeup_socket.close()
    # By default: the NOTIFY, and no datagram.
    with override_settings(GATOR_NOTIFY=True):
        assert engine.notifies
        assert not wakeup.enabled(connection.alias)
        Echo.dispatch(5)
        assert notified(5.0) == ["echo"]
        assert received(inbox, 0.3) == []
        assert WorkerProcess(concurrency=1, install_signal_handlers=False).listen_on is engine


def test_a_port_in_use_leaves_the_worker_polling(inbox):
    host, port = inbox.getsockname()
    assert bind_wakeup_socket(host, port) is None


def test_bind_setting_is_checked():
    with override_settings(GATOR_WAKEUP_BIND="0.0.0.0:7000"):
        assert conf.wakeup_bind() == ("0.0.0.0", 7000)
    with override_settings(GATOR_WAKEUP_BIND="[::1]:0"):
        assert conf.wakeup_bind() == ("::1", 0)
    for bad in ("localhost", "host:99999", ":80", "::1:0", 8000):
        with override_settings(GATOR_WAKEUP_BIND=bad), pytest.raises(InvalidSetting) as error:
            conf.wakeup_bind()
        assert repr(bad) in str(error.value)


def directory_read() -> bool:
    """Whether the read of the wakeup targets that a dispatch asked for is done."""
    directory = wakeup._directories.get(connection.alias)
    if not wakeup.enabled(connection.alias):
        return directory is None
    return directory is not None and not directory._reading.is_set()


def test_dispatch_runs_no_query_of_its_own_for_wakeups():
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        Echo.dispatch(1)
        # The directory is read by a thread of its own meanwhile (where dispatch sends).
        wait_for(directory_read, timeout=10)
        Echo.dispatch(2)
    assert len(queries.captured_queries) == 2, queries.captured_queries
    assert all("INSERT" in q["sql"] for q in queries.captured_queries)


def test_datagrams_that_are_not_wakeups_are_ignored():
    assert wakeup.decode(b"hello") is None
    assert wakeup.decode(wakeup.encode(["b", "a"])) == {"a", "b"}
