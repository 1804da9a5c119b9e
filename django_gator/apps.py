from __future__ import annotations

from importlib import import_module

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class GatorConfig(AppConfig):
    name = "django_gator"
    label = "django_gator"
    verbose_name = "Background jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: Django imports this module before the models are
        # loaded, and dispatch, the engines and the worker import them. Not an import cycle.
        from django_gator import (
            checks,  # noqa: F401 - registers the system checks
            conf,
            wiring,
        )

        # The calls from the worker and the engines down to where lower layers use them
        # (the package's layers: see .importlinter and django_gator/wiring.py).
        wiring.install()

        # Like admin.py: every installed app's `jobs` module registers its jobs (and its
        # `tasks` module with the Tasks backend, and any module in GATOR_AUTODISCOVER).
        for module in conf.autodiscover_modules():
            if module == "tasks":
                # Django tasks register with our backend when @task creates them.
                from django_gator import tasks

                tasks.connect_signals()
            autodiscover_modules(module)
        for path in conf.requested_imports():
            import_module(path)
