"""Run ``python -m django COMMAND ...`` on the test database, as an operator would."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, worker_env


def manage(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """The finished command (its exit code, stdout and stderr as text)."""
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=worker_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
