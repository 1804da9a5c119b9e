"""Several worker processes, one endpoint: prometheus_client's multiprocess directory, where
each process writes its values and the serving process adds them up."""

from __future__ import annotations

import os
import shutil
import tempfile

from django_gator.metrics.client import client

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_multiprocess_dir(path: str | None = None) -> str:
    """Make this process and the children it starts afterwards share their metrics
    through the directory ``path`` (a new temporary one by default; an existing one is
    emptied: files of an earlier run would be counted again). Returns the directory.
    Call it before starting any child and before :func:`enable`."""
    if path is None:
        path = tempfile.mkdtemp(prefix="gator-metrics-")
    else:
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name.endswith(".db"):
                os.remove(os.path.join(path, name))
    os.environ[MULTIPROC_ENV] = path
    client()
    from prometheus_client import values

    # prometheus_client picks the storage of new metrics when it is first imported; it may
    # have been imported before the directory was chosen (by the project, or a library).
    values.ValueClass = values.MultiProcessValue()
    return path


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def mark_dead(pid: int) -> None:
    """A child process exited: drop its live gauges (threads, busy threads, heartbeat)."""
    path = multiprocess_dir()
    if path is not None:
        client()
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, path)


def remove_multiprocess_dir(path: str) -> None:
    """Remove a directory :func:`prepare_multiprocess_dir` made (at the supervisor's exit)."""
    shutil.rmtree(path, ignore_errors=True)
