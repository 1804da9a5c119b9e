"""The CPU-bound job: pure Python arithmetic that holds the GIL for its whole run."""

from __future__ import annotations

from django_gator import Queueable

QUEUE = "cpu-bench"


def spin(loops: int) -> int:
    """About ``loops`` additions and multiplications in the interpreter (no C call that
    would let go of the GIL)."""
    total = 0
    for i in range(loops):
        total = (total + i * i) % 1_000_003
    return total


class CpuJob(Queueable):
    name = "bench.cpu"
    queue = QUEUE

    def handle(self, loops: int) -> None:
        spin(loops)
