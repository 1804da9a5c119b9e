"""The demo script (scripts/demo.sh, `make demo`) as a user runs it: a real shell, a real
worker and development server on a fresh SQLite file."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_demo_does_not_tell_to_start_the_worker_it_started(tmp_path: Path) -> None:
    log_path = tmp_path / "demo.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "GATOR_"))}
    env.update(
        PY=sys.executable,
        DEMO_ADDR=f"127.0.0.1:{free_port()}",
        DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend",
    )
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "demo.sh")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # Up when the worker has run a demo job and the server is listening.
        wait_for(
            lambda: (
                "Processed job" in log_path.read_text()
                and "Quit the server with" in log_path.read_text()
            ),
            timeout=120,
            interval=0.2,
        )
    finally:
        # Stop the server (its process group); the script's trap then stops the worker.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = log_path.read_text()

    assert re.search(r"^Dispatched \d+ demo jobs\.$", output, re.MULTILINE), output
    assert "gator_worker` to process them" not in output
    assert "Worker:    pid" in output
    assert "demo: stopping the worker" in output
