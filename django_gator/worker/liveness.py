"""Whether a worker process on this host is alive, asked of the operating system.

A heartbeat that lapsed means "dead" only as a guess: the owner may merely have been unable
to write it. On SQLite that happens to live workers, as every heartbeat waits for the
database's one write lock. But every process of a WAL database runs on the same host (they
share its memory), so before taking jobs back from such a worker the rescuer can look at
the process itself (Linux ``/proc``):

- ``ALIVE``: it runs (or sleeps, or waits for the lock), and it is the process that
  registered the row: it started before the row was written and it has this database's
  shared memory mapped. Its jobs are not taken back, however old its heartbeat.
- ``STOPPED``: it is stopped (SIGSTOP, a debugger): a frozen worker, whose jobs are taken
  back as RELIABILITY.md requires.
- ``GONE``: no such process, a zombie, or a process that started after the row was written
  (its pid was reused).
- ``UNKNOWN``: another host, no ``/proc`` (not Linux), a process we may not inspect, or one
  that is not a client of this database now (such as a process of another pid namespace
  that happens to have the pid): the heartbeat alone decides, as before.
"""

from __future__ import annotations

import enum
import os
import socket
from datetime import datetime

#: Seconds of clock uncertainty allowed between a process's start and its row's
#: registration (the boot time in /proc/stat has whole seconds).
START_SLACK = 2.0


class Liveness(enum.Enum):
    ALIVE = "alive"
    STOPPED = "stopped"
    GONE = "gone"
    UNKNOWN = "unknown"


def local_worker(
    hostname: str, pid: int, registered_at: datetime, shared_memory: str | None
) -> Liveness:
    """The state of the worker process ``pid`` that registered on ``hostname`` at
    ``registered_at``; ``shared_memory`` is the path of the database's ``-shm`` file."""
    if hostname != socket.gethostname() or pid <= 0 or pid == os.getpid():
        # Our own pid in another worker's row: that worker lives in another pid namespace.
        return Liveness.UNKNOWN
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return Liveness.GONE
    except PermissionError:
        pass  # it exists; another user's
    except OSError:
        return Liveness.UNKNOWN
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as boot:
            booted = next(int(line.split()[1]) for line in boot if line.startswith("btime "))
    except (OSError, StopIteration, IndexError, ValueError):
        return Liveness.UNKNOWN
    state, start_ticks = fields[0], int(fields[19])  # fields 3 and 22 of proc_pid_stat(5)
    if state in ("Z", "X"):
        return Liveness.GONE
    started = booted + start_ticks / os.sysconf("SC_CLK_TCK")
    if started > registered_at.timestamp() + START_SLACK:
        return Liveness.GONE  # a newer process has its pid
    if state in ("T", "t"):
        return Liveness.STOPPED
    if shared_memory is None or not _maps(pid, shared_memory):
        return Liveness.UNKNOWN
    return Liveness.ALIVE


def _maps(pid: int, path: str) -> bool:
    """Whether process ``pid`` has the file at ``path`` mapped: by its path, or by its
    device and inode (the process may see the file under another path)."""
    try:
        st = os.stat(path)
        with open(f"/proc/{pid}/maps") as maps:
            text = maps.read()
    except OSError:
        return False
    device = f" {os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino} "
    return device in text or f" {os.path.realpath(path)}\n" in text
