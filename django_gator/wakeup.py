"""Wakeups without LISTEN: after a dispatch commits, a datagram to each live worker that
serves the job's queue, so an idle worker on SQLite or MariaDB/MySQL starts it within
milliseconds instead of at its next poll.

A worker binds a UDP socket (``GATOR_WAKEUP_BIND``) and publishes its address in its
worker row (``wakeup_address``), with the queues it serves. A dispatching process keeps
the list of those addresses per database alias, read again at most once a second
(:data:`REFRESH_EVERY`), and after the commit sends one small datagram per worker that
serves a dispatched queue: non-blocking, best effort, every error swallowed. A worker that
is gone costs one ``sendto`` that nobody reads; a datagram that is lost costs one poll
interval (the worker still polls, ``GATOR_POLL_INTERVAL``, as the fallback). Nothing here
ever delays a dispatch by more than a ``sendto`` per worker, or fails it.

PostgreSQL has LISTEN/NOTIFY, which rides in the dispatch's own transaction; its workers
bind no socket and dispatch sends no datagram there, unless ``GATOR_NOTIFY = False``:
PostgreSQL serializes the commits of every transaction that sent a NOTIFY (a lock held
through the commit's WAL flush), which caps concurrent dispatches; the datagrams do not.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from django_gator import conf
from django_gator.engines import get_engine

logger = logging.getLogger("django_gator.dispatch")

#: The first bytes of every wakeup datagram; anything else that reaches a worker's socket
#: is ignored. The queue names follow, separated by newlines.
MAGIC = b"gator-wakeup\n"
#: Seconds a process keeps its list of workers' addresses before reading it again.
REFRESH_EVERY = 1.0
#: Seconds a process's first wakeup waits for the first read of the list (a connect and
#: one SELECT, on the reading thread): without it that job waited for a poll.
FIRST_READ_WAIT = 0.25


def enabled(alias: str) -> bool:
    """Whether workers of ``alias`` bind a wakeup socket and dispatch sends to them:
    wherever dispatch sends no NOTIFY (SQLite, MariaDB/MySQL, PostgreSQL with
    ``GATOR_NOTIFY = False``), unless ``GATOR_WAKEUP_BIND`` is None."""
    return not get_engine(alias).notifies and conf.wakeup_bind() is not None


def encode(queues: Iterable[str]) -> bytes:
    return MAGIC + "\n".join(sorted(queues)).encode()


def decode(datagram: bytes) -> set[str] | None:
    """The queues a datagram names, or None if it is not a wakeup."""
    if not datagram.startswith(MAGIC):
        return None
    return set(datagram[len(MAGIC) :].decode(errors="replace").split("\n"))


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def advertised_host(bound_host: str) -> str:
    """The host a worker publishes for a socket bound to ``bound_host``: that host, or for
    a wildcard (``0.0.0.0``, ``::``) this machine's address as its hostname resolves."""
    try:
        wildcard = ipaddress.ip_address(bound_host).is_unspecified
    except ValueError:
        return bound_host  # a name: the senders resolve it
    if not wildcard:
        return bound_host
    family = socket.AF_INET6 if ":" in bound_host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, family, socket.SOCK_DGRAM)
        return str(infos[0][4][0])
    except (OSError, IndexError):
        return bound_host


@dataclass(frozen=True, slots=True)
class Target:
    """A worker's wakeup socket, and the queues it serves (None: every queue)."""

    address: tuple[str, int]
    family: int
    queues: frozenset[str] | None


def _parse_target(hostname: str, queues: Any, address: str, me: str) -> Target | None:
    host, port = conf.split_host_port(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        # A name: resolved here, once per refresh, rather than by each sendto.
        info = socket.getaddrinfo(host, port, 0, socket.SOCK_DGRAM)[0]
        family, resolved = info[0], info[4]
        ip = ipaddress.ip_address(resolved[0])
    else:
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    if ip.is_loopback and hostname != me:
        return None  # another machine's loopback address: not reachable from here
    names = json.loads(queues) if isinstance(queues, str | bytes) else queues
    served = frozenset(str(entry[0]) for entry in names or ()) or None
    return Target((str(ip), port), family, served)


class Directory:
    """The wakeup targets of one database alias, read again at most every
    :data:`REFRESH_EVERY` seconds, by a thread of its own on a connection of its own: a
    dispatch never waits for the read, and never runs a query the caller did not ask for
    (a test's ``assertNumQueries`` sees none). The process's first wakeup waits for the
    first read, at most :data:`FIRST_READ_WAIT`; after that it never waits."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.targets: list[Target] = []
        self.read_at = -REFRESH_EVERY - 1.0  # time.monotonic() of the last read asked for
        self._reading = threading.Event()  # a read is asked for or under way
        self._read_once = threading.Event()  # the first read is over (done or failed)

    def current(self) -> list[Target]:
        if time.monotonic() - self.read_at >= REFRESH_EVERY and not self._reading.is_set():
            self.read_at = time.monotonic()
            self._reading.set()
            _refresher().put(self)
        if not self._read_once.is_set():
            self._read_once.wait(FIRST_READ_WAIT)
        return self.targets

    def refresh(self, *, close: bool = True) -> None:
        """Read the targets now, on this thread's connection (closed afterwards, unless
        ``close`` is False)."""
        try:
            self.targets = self._read()
        except Exception:
            logger.debug("Could not read the workers' wakeup addresses", exc_info=True)
        finally:
            if close:
                connections[self.alias].close()
            self._reading.clear()
            self._read_once.set()

    def _read(self) -> list[Target]:
        cutoff = timezone.now() - timedelta(seconds=conf.heartbeat_timeout())
        me = socket.gethostname()
        targets = []
        for hostname, queues, address in get_engine(self.alias).wakeup_targets(cutoff):
            try:
                target = _parse_target(hostname, queues, address, me)
            except (OSError, ValueError, TypeError, IndexError):
                logger.debug("Ignoring a worker's wakeup address address=%r", address)
                continue
            if target is not None:
                targets.append(target)
        return targets


_requests: queue.SimpleQueue[Directory] | None = None


def _refresher() -> queue.SimpleQueue[Directory]:
    """The queue of the thread that reads directories (started on first use)."""
    global _requests
    if _requests is None:
        with _lock:
            if _requests is None:
                requests: queue.SimpleQueue[Directory] = queue.SimpleQueue()
                threading.Thread(
                    target=_refresh_forever,
                    args=(requests,),
                    name="gator-wakeup-directory",
                    daemon=True,
                ).start()
                _requests = requests
    return _requests


def _refresh_forever(requests: queue.SimpleQueue[Directory]) -> None:
    while True:
        requests.get().refresh()


_directories: dict[str, Directory] = {}
_sockets: dict[int, socket.socket] = {}
_lock = threading.Lock()


def _close_sockets() -> None:
    """At exit: close the sending sockets (an unclosed one is a ResourceWarning)."""
    with _lock:
        for sock in _sockets.values():
            sock.close()
        _sockets.clear()


atexit.register(_close_sockets)


def _socket(family: int) -> socket.socket:
    sock = _sockets.get(family)
    if sock is None:
        with _lock:
            sock = _sockets.get(family)
            if sock is None:
                sock = socket.socket(family, socket.SOCK_DGRAM)
                sock.setblocking(False)
                _sockets[family] = sock
    return sock


def after_commit(alias: str, queues: Collection[str]) -> None:
    """Wake the workers of ``queues`` once the transaction on ``alias`` commits (at once
    in autocommit). Call after the INSERT of jobs that are due now.

    Inside a transaction the send is an ``on_commit`` callback, registered only when some
    live worker serves one of the queues, so that a process without workers (a test run
    counting its on_commit callbacks) sees no callback of ours."""
    if not queues or not enabled(alias):
        return
    if not connections[alias].in_atomic_block:
        send(alias, queues)
        return
    try:
        wanted = set(queues)
        if not any(t.queues is None or wanted & t.queues for t in _directory(alias).current()):
            return
    except Exception:
        logger.debug("Could not read the workers' wakeup addresses alias=%s", alias, exc_info=True)
        return
    transaction.on_commit(lambda: send(alias, queues), using=alias, robust=True)


def _directory(alias: str) -> Directory:
    directory = _directories.get(alias)
    if directory is None:
        directory = _directories.setdefault(alias, Directory(alias))
    return directory


def send(alias: str, queues: Collection[str]) -> int:
    """Send a wakeup to every live worker of ``alias`` that serves one of ``queues``;
    returns the number of datagrams sent. Never raises: a wakeup is only a hint."""
    sent = 0
    try:
        wanted = set(queues)
        for target in _directory(alias).current():
            names = wanted if target.queues is None else wanted & target.queues
            if not names:
                continue
            try:
                _socket(target.family).sendto(encode(names), target.address)
                sent += 1
            except OSError:
                # Full buffer, unreachable network, or an ICMP "port unreachable" from an
                # earlier datagram to a worker that is gone: the poll covers it.
                continue
    except Exception:
        logger.debug("Could not send wakeups alias=%s", alias, exc_info=True)
    return sent


def refresh(alias: str) -> None:
    """Read the wakeup targets of ``alias`` now, on this thread's connection (tests)."""
    _directory(alias).refresh(close=False)


def forget() -> None:
    """Drop every cached list of targets (tests; a process that forked)."""
    _directories.clear()


def _after_fork() -> None:
    # The refresher thread and the sockets are the parent's: start afresh.
    global _requests
    _requests = None
    _directories.clear()
    _sockets.clear()


os.register_at_fork(after_in_child=_after_fork)
