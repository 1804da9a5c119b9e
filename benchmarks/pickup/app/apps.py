from __future__ import annotations

import os

from django.apps import AppConfig


class PickupConfig(AppConfig):
    name = "benchmarks.pickup.app"
    label = "gator_pickup"

    def ready(self) -> None:
        # The worker process started by the benchmark counts its own SQL statements
        # (every statement goes through a Django cursor) and writes the count to a file.
        path = os.environ.get("GATOR_PICKUP_COUNT_FILE")
        if path:
            from benchmarks.pickup.app import counting

            counting.install(path)
