"""Threads that wake the fetcher when a dispatch commits, so an idle worker starts a new job
within milliseconds of its commit instead of at its next poll: on PostgreSQL one that
LISTENs (:func:`listen`), elsewhere one that reads the wakeup datagrams dispatch sends to
the address in this worker's row (:func:`receive_wakeups`; see :mod:`django_gator.wakeup`)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Collection

from django_gator import wakeup
from django_gator.engines import JobEngine
from django_gator.worker.retrier import backoff
from django_gator.worker.slots import Slots

logger = logging.getLogger("django_gator.worker")


def listen(
    engine: JobEngine,
    slots: Slots,
    queues: Collection[str],
    stopped: threading.Event,
    worker_id: str,
) -> None:
    """Wake the fetcher when a dispatch for one of ``queues`` (any queue if empty)
    commits, until ``stopped`` is set. A lost connection is reopened with a backoff; the
    fetcher polls meanwhile."""
    wanted = set(queues)
    failures = 0
    while not stopped.is_set():
        try:
            with engine.listen() as listener:
                failures = 0
                while not stopped.is_set():
                    notified = listener.wait(1.0)
                    ours = notified & wanted if wanted else notified
                    if ours:
                        slots.notify_fetcher(notified=True, queues=ours)
        except Exception:
            failures += 1
            logger.warning(
                "LISTEN connection failed; polling until it is back worker=%s",
                worker_id,
                exc_info=failures == 1,
            )
            stopped.wait(backoff(failures))


def bind_wakeup_socket(host: str, port: int) -> tuple[socket.socket, str] | None:
    """A UDP socket bound to ``host:port`` and the address to publish for it, or None
    (logged) if it cannot be bound: the worker then polls."""
    try:
        info = socket.getaddrinfo(host, port, 0, socket.SOCK_DGRAM)[0]
        sock = socket.socket(info[0], socket.SOCK_DGRAM)
    except OSError as exc:
        logger.warning("No wakeup socket (%s:%s: %s); polling instead", host, port, exc)
        return None
    try:
        sock.bind(info[4])
    except OSError as exc:
        sock.close()
        logger.warning("No wakeup socket (%s:%s: %s); polling instead", host, port, exc)
        return None
    bound_host, bound_port = sock.getsockname()[:2]
    return sock, wakeup.format_address(wakeup.advertised_host(bound_host), bound_port)


def receive_wakeups(
    sock: socket.socket,
    slots: Slots,
    queues: Collection[str],
    stopped: threading.Event,
) -> None:
    """Wake the fetcher when a wakeup datagram names one of ``queues`` (any queue if
    empty), until ``stopped`` is set; closes ``sock`` then."""
    wanted = set(queues)
    sock.settimeout(0.5)  # how soon a stop is seen
    try:
        while not stopped.is_set():
            try:
                datagram = sock.recv(2048)
            except TimeoutError:
                continue
            named = wakeup.decode(datagram)
            # Drain what else arrived meanwhile: one claim round answers them all.
            sock.setblocking(False)
            try:
                while True:
                    more = wakeup.decode(sock.recv(2048))
                    if more is not None:
                        named = (named or set()) | more
            except OSError:
                pass
            sock.settimeout(0.5)
            ours = (named & wanted if wanted else named) if named is not None else None
            if ours:
                slots.notify_fetcher(notified=True, queues=ours)
    finally:
        sock.close()
