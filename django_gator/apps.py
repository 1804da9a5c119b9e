from __future__ import annotations

from collections.abc import Collection

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
            immediate,
        )
        from django_gator.engines import core as engines
        from django_gator.engines import get_engine
        from django_gator.models import membership
        from django_gator.worker import connections, inline

        # The wiring from the worker down: dispatch and the engines call the worker's code
        # through these without importing it (the package's layers: see .importlinter).
        immediate.set_inline_runner(inline.run_inline, inline.inline_worker_id)
        engines.set_connection_hook(connections.bound_connection)

        # The job verbs (cancel, retry) settle and re-open batches through the engines.
        def settle(alias: str, ids: Collection[int]) -> None:
            callbacks = get_engine(alias).settle_now(ids)
            if callbacks and conf.immediate():  # as dispatch runs them
                immediate.after_commit(alias, lambda: immediate.run_immediately(alias, callbacks))

        membership.install(
            settle=settle,
            reopen=lambda alias, ids: get_engine(alias).reopen_batches(ids),
            probe=lambda alias, batch_id: get_engine(alias).probe_batch(batch_id),
        )

        # Like admin.py: every installed app's `jobs` module registers its jobs (and its
        # `tasks` module with the Tasks backend, and any module in GATOR_AUTODISCOVER).
        for module in conf.autodiscover_modules():
            if module == "tasks":
                # Django tasks register with our backend when @task creates them.
                from django_gator import tasks

                tasks.connect_signals()
            autodiscover_modules(module)
