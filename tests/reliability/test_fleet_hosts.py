"""The fleet benchmark's network hosts (benchmarks/fleet/netns.py): Linux network namespaces
joined by veth pairs to this host, made and removed by the benchmark. A worker inside one
runs jobs against a throwaway PostgreSQL cluster (tests/clusters.py) listening on the
host's side of the link, and its connections come from the namespace's own address.

Needs root and iproute2 (``ip``), and PostgreSQL's server binaries: skipped, saying which is
missing, where they are not. Runs in the PostgreSQL pass only (a cluster of its own).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from django.db import connection

from benchmarks.fleet import netns
from tests.conftest import ROOT

pytestmark = [
    pytest.mark.clusters,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="runs in the PostgreSQL pass (on a throwaway cluster of its own)",
    ),
    pytest.mark.skipif(netns.missing() is not None, reason=f"{netns.missing()}"),
]

JOBS = 30


def _env(url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "benchmarks.fleet.settings",
        "PYTHONPATH": str(ROOT),
        "GATOR_FLEET_ROLE": "test",
    }


def _django(url: str, *argv: str, host: netns.Host | None = None) -> str:
    command = [sys.executable, *argv]
    done = subprocess.run(
        host.command(command) if host else command,
        cwd=ROOT,
        env=_env(url),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"{argv} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _connect(host: netns.Host, address: str, port: int) -> int:
    """The exit status of a TCP connection attempt from inside ``host`` (0: connected)."""
    code = f"import socket; socket.create_connection(({address!r}, {port}), timeout=5)"
    return subprocess.run(
        host.command([sys.executable, "-c", code]), capture_output=True, timeout=30
    ).returncode


def test_hosts_are_made_and_removed_whole():
    network = netns.Network(2)
    try:
        network.create()
        assert sorted(netns.namespaces()) == ["gator-fleet-1", "gator-fleet-2"]
        assert sorted(netns.links()) == ["gfl1h", "gfl2h"]
        inside = subprocess.run(
            network.hosts[1].command(["ip", "-o", "-4", "addr", "show"]),
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        assert "10.231.2.2/24" in inside
        assert "127.0.0.1/8" in inside
        # Host 2 reaches the database's host over its own link only (no route elsewhere),
        # and its connections come from its own address.
        with socket.socket() as server:
            server.bind(("0.0.0.0", 0))
            server.listen()
            port = server.getsockname()[1]
            assert _connect(network.hosts[1], "10.231.2.1", port) == 0
            accepted, peer = server.accept()
            accepted.close()
            assert peer[0] == "10.231.2.2"
            assert _connect(network.hosts[1], "10.231.1.1", port) != 0
    finally:
        removed = network.remove()
    assert "namespace gator-fleet-1" in removed
    assert netns.namespaces() == []
    assert netns.links() == []


def test_leftovers_of_an_interrupted_run_are_cleaned_up():
    try:
        netns.Network(1).create()  # and never removed, as if the run had been killed
        assert netns.namespaces() == ["gator-fleet-1"]
        assert netns.cleanup() == ["namespace gator-fleet-1"]
        assert netns.namespaces() == []
        assert netns.links() == []
    finally:
        netns.cleanup()  # a failed assertion above leaves nothing behind either


def test_a_worker_in_a_namespace_runs_jobs_against_the_cluster():
    from tests import clusters

    if clusters.server_binaries() is None:
        pytest.skip("no PostgreSQL server binaries (initdb): cannot make a throwaway cluster")
    network = netns.Network(1)
    host = network.hosts[0]
    try:
        network.create()  # before the server starts: it listens on the link's address
        listen = f"'127.0.0.1,{host.server_address}'"
        with clusters.throwaway_cluster(listen_addresses=listen) as cluster:
            cluster.allow(f"{host.address}/32")
            local = cluster.url("gator")
            remote = f"postgres://postgres@{host.server_address}:{cluster.port}/gator"
            _django(local, "-m", "django", "migrate", "-v", "0")
            _django(
                local,
                "-c",
                "import django; django.setup(); "
                "from benchmarks.fleet.app.jobs import FleetWrite; "
                f"FleetWrite.dispatch_many([[]] * {JOBS})",
            )
            _django(remote, "-m", "django", "gator_worker", "-q", "fleet", "--burst", host=host)
            done = cluster.execute(
                "SELECT count(*) FROM django_gator_job WHERE state = 'succeeded'", "gator"
            )
            addresses = cluster.execute(
                "SELECT string_agg(DISTINCT host(client_addr), ',') || ' ' || count(*) "
                "FROM gator_fleet_written",
                "gator",
            )
    finally:
        network.remove()
    assert done == str(JOBS)
    assert addresses == f"{host.address} {JOBS}"  # every job ran over the namespace's link
