from django.db import models

#: Rows of Counter the realistic job updates (by primary key, i % ROWS).
ROWS = 1000


class Counter(models.Model):
    """The project's own table that the realistic job writes to: one indexed UPDATE."""

    hits = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"counter {self.pk}: {self.hits}"


class ProbeRow(models.Model):
    """The row-writing latency probe's table: the job inserts one row (its number and the
    time it started) through the ORM, as a user's job writes its result; the driver, in
    another process, polls for it."""

    number = models.BigIntegerField(primary_key=True)
    started = models.FloatField()

    def __str__(self) -> str:
        return f"probe {self.number} started at {self.started}"
