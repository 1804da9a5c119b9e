"""A clock that tests move forward for worker processes: an ISO timestamp in the file named
by GATOR_TEST_CLOCK_FILE (written atomically by ``set_file_clock``)."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path


def file_clock() -> datetime:
    return datetime.fromisoformat(Path(os.environ["GATOR_TEST_CLOCK_FILE"]).read_text())


def set_file_clock(path: Path, now: datetime) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(now.isoformat())
    temporary.replace(path)
