"""Read replicas: where the surfaces that only read take their rows (``GATOR_READ_DATABASE``).

The admin's job lists, counts and dashboard, the queue gauges behind ``/metrics``,
``gator_status`` and, when its backend asks for it, the Tasks backend's ``get_result``
read from the alias ``GATOR_READ_DATABASE`` names, a replica of ``GATOR_DATABASE`` (the
primary). Every write goes to the primary. :func:`read_source` decides, for one page or
one scrape, where to read:

- the replica, when it answers and lags at most ``GATOR_READ_DATABASE_MAX_LAG`` seconds
  (measured as :mod:`django_gator.engines.replication` says) and has replayed the write
  the caller made last (``after``: the admin's read-your-writes);
- otherwise the primary, with the reason, which the admin shows on the page. A replica
  that did not answer is left alone for :data:`DOWN_RECHECK` seconds (its connections get
  a 2-second connect timeout), so a dead replica costs one short wait, not one per page.

With ``GATOR_READ_DATABASE = None`` (the default) every read goes to ``GATOR_DATABASE`` as
before, and no statement is added anywhere.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass

from django.db import DatabaseError, connections

from django_gator import conf
from django_gator.engines import replication

logger = logging.getLogger("django_gator.replicas")

#: Seconds a replica that did not answer is not asked again (each process).
DOWN_RECHECK = 5.0


def read_database() -> str | None:
    """``GATOR_READ_DATABASE``: the read replica's alias, or None."""
    alias = conf.value("GATOR_READ_DATABASE")
    return None if alias is None else str(alias)


def max_lag() -> float:
    return float(conf.value("GATOR_READ_DATABASE_MAX_LAG"))


@dataclass(frozen=True, slots=True)
class Written:
    """Where and when the primary was written last by a caller (the admin keeps one per
    session): a read of the replica shows that write once the replica has replayed
    ``position`` (PostgreSQL), or, where positions are not measured, once its lag is
    shorter than the time since ``at`` (Unix time)."""

    position: int | None
    at: float

    def as_dict(self) -> dict[str, float | int | None]:
        return {"position": self.position, "at": self.at}

    @classmethod
    def from_dict(cls, data: object) -> Written | None:
        if not isinstance(data, dict):
            return None
        position, at = data.get("position"), data.get("at")
        if not isinstance(at, int | float) or not (position is None or isinstance(position, int)):
            return None
        return cls(position, float(at))


def shows(lag: replication.Lag, written: Written | None) -> bool:
    """Whether a replica that lags ``lag`` shows the write ``written``."""
    if written is None or not lag.standby:
        return True
    if written.position is not None and lag.position is not None:
        return lag.has_replayed(written.position)
    return lag.seconds is not None and lag.seconds < time.time() - written.at


@dataclass(frozen=True, slots=True)
class ReadSource:
    """Where one page (or scrape, or command) reads: ``alias``. ``replica``: the
    configured read replica (None without one); ``lag``: its lag in seconds when it is
    read; ``fallback``: why the primary is read instead (empty when it is not)."""

    alias: str
    primary: str
    replica: str | None = None
    lag: float | None = None
    fallback: str = ""

    @property
    def on_replica(self) -> bool:
        return self.replica is not None and not self.fallback

    def describe(self) -> str:
        """One sentence for the page: where it read, and the lag or the reason."""
        if self.replica is None:
            return f"Read from {self.primary!r}."
        if self.on_replica:
            return (
                f"Read from the replica {self.replica!r}, "
                f"{self.lag or 0.0:.1f} s behind the primary {self.primary!r}."
            )
        return (
            f"Read from the primary {self.primary!r}: the replica {self.replica!r} {self.fallback}."
        )


_lock = threading.Lock()
#: Replica alias -> (monotonic time until which it is not asked, why).
_down: dict[str, tuple[float, str]] = {}


def forget_failures() -> None:
    """Ask every replica again at the next read (tests; a replica known to be back)."""
    with _lock:
        _down.clear()


def primary_source() -> ReadSource:
    """Reading the primary on purpose (a page that writes, or that just wrote). No
    statement."""
    primary = conf.database()
    return ReadSource(
        primary, primary, read_database(), fallback="is not read by a page that writes"
    )


def read_source(after: Written | None = None) -> ReadSource:
    """Where to read now (see the module's docstring). ``after``: the caller's last write,
    which the page must show. Without a replica: the primary, and no statement; with
    one: one statement on the replica, and on PostgreSQL one on the primary while the
    replica is a standby (see :func:`django_gator.engines.replication.lag`)."""
    primary = conf.database()
    replica = read_database()
    if replica is None:
        return ReadSource(primary, primary)
    with _lock:
        down = _down.get(replica)
    if down is not None and time.monotonic() < down[0]:
        return ReadSource(primary, primary, replica, fallback=down[1])
    try:
        replication.bound_connect(replica)
        measured = replication.lag(replica, primary)
    except DatabaseError as exc:
        return _failed(primary, replica, exc)
    limit = max_lag()
    if measured.seconds is None:
        reason = f"cannot tell its lag: {measured.unknown}"
    elif measured.seconds > limit:
        reason = (
            f"lags {measured.seconds:.1f} s, more than GATOR_READ_DATABASE_MAX_LAG ({limit:g} s)"
        )
    elif not shows(measured, after):
        reason = "has not yet replayed the latest change made here"
    else:
        return ReadSource(replica, primary, replica, lag=measured.seconds)
    return ReadSource(primary, primary, replica, lag=measured.seconds, fallback=reason)


def _failed(primary: str, replica: str, exc: DatabaseError) -> ReadSource:
    """The replica did not answer: note it for DOWN_RECHECK seconds, read the primary."""
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    reason = f"does not answer ({first_line})"
    logger.warning("Read replica unavailable alias=%s error=%s", replica, first_line)
    with contextlib.suppress(DatabaseError):
        connections[replica].close()  # the next try reconnects
    with _lock:
        _down[replica] = (time.monotonic() + DOWN_RECHECK, reason)
    return ReadSource(primary, primary, replica, fallback=reason)


def written() -> Written | None:
    """The primary's position now, right after a write (the admin keeps it in the
    session); None without a replica (no statement then). One statement on PostgreSQL."""
    if read_database() is None:
        return None
    return Written(replication.write_position(conf.database()), time.time())
