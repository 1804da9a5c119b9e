from __future__ import annotations

from django.apps import AppConfig


class ProcessesBenchConfig(AppConfig):
    name = "benchmarks.processes.app"
    label = "gator_processes_bench"
