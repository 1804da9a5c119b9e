from django.db import models


class Execution(models.Model):
    """A ledger of job runs. The unique (job_id, attempt) pair makes a double run of one
    claim fail loudly; ``job_id`` alone counts runs across attempts."""

    job_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    pid = models.PositiveIntegerField()
    label = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job_id", "attempt"], name="execution_once_per_claim")
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt}"


class ItemDone(models.Model):
    """A ledger of the items long-running jobs processed: one row per item per attempt,
    so an item processed twice shows twice."""

    job_id = models.BigIntegerField()
    item = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField()
    pid = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"job {self.job_id} item {self.item} attempt {self.attempt}"
