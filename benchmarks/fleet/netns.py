"""Separate network hosts on one machine: Linux network namespaces joined by veth pairs to
the database's host (the root namespace), made and removed with iproute2.

Host ``k`` (1-based) is the namespace ``gator-fleet-k``. Its veth pair is ``gflkh`` (in
the root namespace, address 10.231.k.1/24) and ``gflkn`` (inside, 10.231.k.2/24); each
host has its own /24, and only its database-side address is reachable from it, so its
connections come from 10.231.k.2 and the server tells the hosts apart by client address.
Nothing is routed between the hosts, and no forwarding or firewall rule is touched.

Needs root (CAP_NET_ADMIN) and the ``ip`` command: :func:`require` says which is missing.
:meth:`Network.remove` and :func:`cleanup` delete every namespace and link of this prefix,
whatever state a failed or interrupted run left them in (deleting a namespace deletes the
veth end inside it, and with it the pair).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field

PREFIX = "gator-fleet-"
LINK_PREFIX = "gfl"
SUBNET = "10.231"


class NetworkError(RuntimeError):
    """The namespaces could not be made: a missing tool, no root, an iproute2 error."""


def missing() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return (
            "network namespaces need root (CAP_NET_ADMIN): run as root, e.g. with sudo; "
            f"this process runs as uid {os.geteuid()}"
        )
    if ip_binary() is None:
        return "no 'ip' command (iproute2): apt-get install iproute2"
    return None


def require() -> None:
    reason = missing()
    if reason:
        raise NetworkError(reason)


def ip_binary() -> str | None:
    return shutil.which("ip") or next(
        (path for path in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.path.exists(path)),
        None,
    )


def ip(*args: str, check: bool = True) -> str:
    binary = ip_binary()
    if binary is None:
        raise NetworkError("no 'ip' command (iproute2): apt-get install iproute2")
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Host:
    """One network host: its namespace, and the addresses at both ends of its link."""

    index: int

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.index}"

    @property
    def label(self) -> str:
        return f"h{self.index}"

    @property
    def server_address(self) -> str:
        """The database host's address on this host's link (where the server listens)."""
        return f"{SUBNET}.{self.index}.1"

    @property
    def address(self) -> str:
        """This host's own address (its connections' client_addr on the server)."""
        return f"{SUBNET}.{self.index}.2"

    @property
    def outer_link(self) -> str:
        return f"{LINK_PREFIX}{self.index}h"

    @property
    def inner_link(self) -> str:
        return f"{LINK_PREFIX}{self.index}n"

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return [ip_binary() or "ip", "netns", "exec", self.name, *argv]


@dataclass
class Network:
    """``count`` hosts (1 to 200), made by :meth:`create` and removed by :meth:`remove`."""

    count: int
    hosts: list[Host] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 200:
            raise ValueError(f"a fleet has 1 to 200 hosts, not {self.count!r}")
        self.hosts = [Host(index) for index in range(1, self.count + 1)]

    def create(self) -> None:
        require()
        cleanup()  # a failed run's leftovers would make `ip netns add` fail
        try:
            for host in self.hosts:
                self._create(host)
        except BaseException:
            self.remove()
            raise

    def _create(self, host: Host) -> None:
        ip("netns", "add", host.name)
        ip("link", "add", host.outer_link, "type", "veth", "peer", "name", host.inner_link)
        ip("link", "set", host.inner_link, "netns", host.name)
        ip("addr", "add", f"{host.server_address}/24", "dev", host.outer_link)
        ip("link", "set", host.outer_link, "up")
        inside = ("netns", "exec", host.name, ip_binary() or "ip")
        ip(*inside, "addr", "add", f"{host.address}/24", "dev", host.inner_link)
        ip(*inside, "link", "set", host.inner_link, "up")
        ip(*inside, "link", "set", "lo", "up")

    def remove(self) -> list[str]:
        return cleanup()

    def server_addresses(self) -> list[str]:
        return [host.server_address for host in self.hosts]

    def host_of(self, address: str | None) -> str:
        """The label of the host whose connections come from ``address`` ("db" for the
        database's own host)."""
        for host in self.hosts:
            if address == host.address:
                return host.label
        return "db"


def namespaces() -> list[str]:
    """This benchmark's namespaces that exist now."""
    if ip_binary() is None:
        return []
    names = [line.split()[0] for line in ip("netns", "list", check=False).splitlines() if line]
    return [name for name in names if name.startswith(PREFIX)]


def links() -> list[str]:
    """This benchmark's veth ends in the root namespace that exist now."""
    if ip_binary() is None:
        return []
    found = []
    for line in ip("-o", "link", "show", check=False).splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(LINK_PREFIX) and name[len(LINK_PREFIX) :][:-1].isdigit():
            found.append(name)
    return found


def cleanup() -> list[str]:
    """Delete every namespace and root-side link of this benchmark; what was deleted."""
    removed = []
    for name in namespaces():
        ip("netns", "del", name, check=False)
        removed.append(f"namespace {name}")
    # A deleted namespace takes its veth pairs with it, but the kernel removes them a moment
    # later: wait for that, then delete the links no namespace took (a half-made host).
    deadline = time.monotonic() + 5.0
    while removed and links() and time.monotonic() < deadline:
        time.sleep(0.05)
    for name in links():
        ip("link", "del", name, check=False)
        removed.append(f"link {name}")
    return removed
