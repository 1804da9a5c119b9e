from django.db import models

#: Rows of Counter the realistic job updates (by primary key, i % ROWS).
ROWS = 1000


class Counter(models.Model):
    """The project's own table that the realistic job writes to: one indexed UPDATE."""

    hits = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"counter {self.pk}: {self.hits}"
