from __future__ import annotations

import os

from django.apps import AppConfig


class SoakConfig(AppConfig):
    name = "benchmarks.soak.app"
    label = "gator_soak"

    def ready(self) -> None:
        # Worker processes started by the harness time their own SQL statements (see
        # timing.py); the harness reads the files they write.
        directory = os.environ.get("GATOR_SOAK_TIMINGS")
        if directory:
            from benchmarks.soak.app import timing

            timing.install(directory)
        census = os.environ.get("GATOR_SOAK_CENSUS")
        if directory and census:
            from benchmarks.soak.app import census as census_module

            trace = os.environ.get("GATOR_SOAK_CENSUS_TRACE") == "1"
            census_module.install(directory, float(census), trace)
