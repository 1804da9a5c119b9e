"""The soak's ledger tables: what the jobs of the mix write, so that the report can check
exactly-once, dependency order and limits from the database rather than from the jobs
table (which the automatic pruner empties as the run goes on).

- :class:`CallbackRun`: one row per run of a batch callback (``on_complete``,
  ``on_success``).
- :class:`StepRun`: one row per run of a workflow step, with when its handler started
  and ended.
- :class:`LimitedRun`: one row per run of a job held to a limit (a keyed class, a limited
  queue), with its claim time (the row's ``locked_at``, the database's time of the limited
  claim) and when its handler started and ended.
- :class:`DeletedJobs`: rows deleted from ``django_gator_job``, by job name and by the
  state they had; kept by a database trigger (migration 0002), so every row that leaves
  the table is counted, whoever deletes it.
"""

from __future__ import annotations

from django.db import models


class CallbackRun(models.Model):
    batch_id = models.BigIntegerField()
    callback = models.CharField(max_length=16)  # "complete" or "success"
    job_id = models.BigIntegerField()
    ran_at = models.FloatField()  # Unix time, the worker's clock

    class Meta:
        indexes = [models.Index(fields=["batch_id"], name="gator_soak_callback_batch")]

    def __str__(self) -> str:
        return f"on_{self.callback} of batch {self.batch_id} (job {self.job_id})"


class StepRun(models.Model):
    workflow = models.CharField(max_length=64)  # the harness's label of the workflow
    step = models.CharField(max_length=8)
    job_id = models.BigIntegerField()
    started = models.FloatField()
    ended = models.FloatField()

    class Meta:
        indexes = [models.Index(fields=["workflow"], name="gator_soak_step_workflow")]

    def __str__(self) -> str:
        return f"step {self.step} of {self.workflow} (job {self.job_id})"


class LimitedRun(models.Model):
    scope = models.CharField(max_length=64)  # "key:<account>" or "queue:<name>"
    job_id = models.BigIntegerField()
    attempt = models.IntegerField()
    claimed_at = models.DateTimeField(null=True)  # the job row's locked_at
    started = models.FloatField()
    ended = models.FloatField()

    def __str__(self) -> str:
        return f"{self.scope}: job {self.job_id} attempt {self.attempt}"


class DeletedJobs(models.Model):
    name = models.CharField(max_length=255)
    state = models.CharField(max_length=16)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["name", "state"], name="gator_soak_deleted_unique")
        ]

    def __str__(self) -> str:
        return f"{self.count} {self.name} deleted while {self.state}"
