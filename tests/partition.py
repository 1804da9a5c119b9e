"""A network black hole around one worker process, made with iptables (root only).

The worker is started inside a cgroup (v2) of its own. From the start, a mangle rule marks
every TCP connection that a process of that cgroup opens on the loopback interface
(CONNMARK); the mark changes nothing by itself. ``cut()`` drops every packet of the marked
connections, in both directions, and every new connection the worker tries (its SYN is
marked before it is dropped): the worker and the server each see the other go silent, as
behind a failed router, and nobody gets a reset. ``heal()`` removes the drop.

Only the connections of processes in that cgroup are matched: other processes' connections
to the same servers (other test runs, other engineers) are never touched. Every rule is
removed, and the cgroup with it, by ``close()``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from pathlib import Path

_counter = itertools.count(1)


def cgroup2_root() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted, if it is."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def unavailable() -> str | None:
    """Why a black hole cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "the partition tests need root, for iptables and cgroups"
    if shutil.which("iptables") is None:
        return "the partition tests need iptables (make test installs it with apt-get as root)"
    if cgroup2_root() is None:
        return "the partition tests need a cgroup v2 hierarchy (none is mounted)"
    try:
        with Blackhole() as probe:
            probe.cut()
            probe.heal()
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        return f"iptables cannot match a cgroup and mark connections here: {detail!s}".strip()
    return None


class Blackhole:
    def __init__(self) -> None:
        root = cgroup2_root()
        if root is None:
            raise OSError("no cgroup v2 hierarchy is mounted")
        number = next(_counter)
        self.name = f"gator-blackhole-{os.getpid()}-{number}"
        self.cgroup = root / self.name
        # A mark of our own: "gt" and the low bits of our pid and counter.
        self.mark = f"0x6774{(os.getpid() * 16 + number) & 0xFFFF:04x}"
        self._mark_rule = [
            "OUTPUT", "-o", "lo", "-p", "tcp", "-m", "cgroup", "--path", self.name,
            "-j", "CONNMARK", "--set-mark", self.mark,
        ]  # fmt: skip
        self._drop_rule = [
            "OUTPUT", "-o", "lo", "-p", "tcp", "-m", "connmark", "--mark", self.mark, "-j", "DROP",
        ]  # fmt: skip
        self._marking = False
        self.is_cut = False
        self.cgroup.mkdir()
        try:
            _iptables("-t", "mangle", "-I", *self._mark_rule)
        except BaseException:
            self.cgroup.rmdir()
            raise
        self._marking = True

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def command_prefix(self) -> list[str]:
        """Prepend to a command to run it inside the cgroup (before it opens a socket)."""
        procs = self.cgroup / "cgroup.procs"
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs)]

    def cut(self) -> None:
        _iptables("-I", *self._drop_rule)
        self.is_cut = True

    def heal(self) -> None:
        if self.is_cut:
            _iptables("-D", *self._drop_rule)
            self.is_cut = False

    def close(self) -> None:
        try:
            self.heal()
        finally:
            if self._marking:
                _iptables("-t", "mangle", "-D", *self._mark_rule)
                self._marking = False
            if self.cgroup.exists():
                # Processes still inside (a worker not yet reaped) go back to the root.
                parent = self.cgroup.parent / "cgroup.procs"
                for pid in (self.cgroup / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):  # it exited meanwhile
                        parent.write_text(pid)
                self.cgroup.rmdir()


def _iptables(*args: str) -> None:
    subprocess.run(["iptables", "-w", "5", *args], check=True, capture_output=True, text=True)


def tcp_ports(pid: int) -> set[int]:
    """The local ports of the TCP sockets that process ``pid`` holds open."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def connection_bounds(alias: str = "default") -> dict[str, dict[str, int]]:
    """What bounds the silence of this thread's connection to ``alias``: the server's
    session settings and the client socket's options (read back, not assumed)."""
    import socket

    from django.db import connections

    connection = connections[alias]
    connection.ensure_connection()
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                [list(PG_SESSION_SETTINGS)],
            )
            server = {name: int(value) for name, value in cursor.fetchall()}
        else:
            names = MARIADB_SESSION_SETTINGS
            cursor.execute("SELECT " + ", ".join(f"@@session.{name}" for name in names))
            server = dict(zip(names, map(int, cursor.fetchone()), strict=True))
    sock = socket.socket(fileno=os.dup(connection.connection.fileno()))
    try:
        client = {
            "SO_KEEPALIVE": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            **{
                name: sock.getsockopt(socket.IPPROTO_TCP, getattr(socket, name))
                for name in ("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT", "TCP_USER_TIMEOUT")
            },
        }
    finally:
        sock.close()
    return {"server": server, "client": client}


PG_SESSION_SETTINGS = (
    "tcp_keepalives_idle",
    "tcp_keepalives_interval",
    "tcp_keepalives_count",
    "tcp_user_timeout",
    "client_connection_check_interval",
    "idle_in_transaction_session_timeout",
)
MARIADB_SESSION_SETTINGS = (
    "idle_transaction_timeout",
    "idle_write_transaction_timeout",
    "wait_timeout",
    "net_read_timeout",
)
