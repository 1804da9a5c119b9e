"""An object census the soak can run in its worker processes (``--census``): every
``interval`` seconds, the number of objects the garbage collector tracks, by type, is
appended as one JSON line to ``<directory>/census-<pid>.jsonl``. A type whose count keeps
growing after the first minutes is what a leak is made of; a flat census beside a growing
RSS points at the allocator instead. It reads ``gc.get_objects()`` (the containers the
collector tracks: no str or int, nor a dict or tuple holding only such values) without
collecting, a few hundred milliseconds each time.

With ``trace`` (``--census-trace``) the worker also runs tracemalloc (slower, and more
memory) and each census after the warm-up adds the allocation sites whose memory grew most
since the first census after it. The warm-up (600 s) and the frames kept per allocation (1:
the source line) can be changed with the environment variables GATOR_SOAK_CENSUS_WARM_UP
and GATOR_SOAK_CENSUS_FRAMES; with more than one frame the sites are whole tracebacks.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path


def _census() -> dict[str, int]:
    return dict(Counter(type(o).__qualname__ for o in gc.get_objects()).most_common(200))


#: Seconds into the run from which growth counts (the first minutes are warm-up).
WARM_UP = 600.0


def _loop(path: Path, interval: float, trace: bool) -> None:
    started = time.time()
    warm_up = float(os.environ.get("GATOR_SOAK_CENSUS_WARM_UP") or WARM_UP)
    group = "traceback" if tracemalloc.get_traceback_limit() > 1 else "lineno"
    baseline: tracemalloc.Snapshot | None = None
    while True:
        time.sleep(interval)
        line: dict[str, object] = {"at": time.time(), "types": _census()}
        if trace and time.time() - started >= warm_up:
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            if baseline is None:
                baseline = snapshot
            else:
                top = snapshot.compare_to(baseline, group)[:15]
                line["lines"] = [
                    [" <- ".join(str(frame) for frame in s.traceback), s.size_diff, s.count_diff]
                    for s in top
                ]
        with path.open("a") as out:
            out.write(json.dumps(line) + "\n")


def install(directory: str, interval: float, trace: bool = False) -> None:
    if trace:
        tracemalloc.start(int(os.environ.get("GATOR_SOAK_CENSUS_FRAMES") or 1))
    path = Path(directory) / f"census-{os.getpid()}.jsonl"
    threading.Thread(
        target=_loop, args=(path, interval, trace), name="gator-soak-census", daemon=True
    ).start()


def growth(path: Path, after: float) -> dict[str, object]:
    """The types whose count grew most from the first census at least ``after`` seconds
    into the file to the last one."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if len(lines) < 2:
        return {"censuses": len(lines)}
    start = next((c for c in lines if c["at"] - lines[0]["at"] >= after), lines[0])
    end = lines[-1]
    grew = {
        name: end["types"].get(name, 0) - start["types"].get(name, 0)
        for name in set(end["types"]) | set(start["types"])
    }
    top = sorted(grew.items(), key=lambda item: -item[1])[:10]
    return {
        "censuses": len(lines),
        "from_minute": round((start["at"] - lines[0]["at"]) / 60, 1),
        "span_minutes": round((end["at"] - start["at"]) / 60, 1),
        "objects": [sum(start["types"].values()), sum(end["types"].values())],
        "grew_most": top,
        "lines_grew_most": end.get("lines", []),
    }
