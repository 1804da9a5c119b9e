"""The row each ``fleet.write`` job writes: which job, from which network host."""

from __future__ import annotations

from django.db import models


class Written(models.Model):
    job_id = models.BigIntegerField()
    #: The client address of the worker's server session (inet_client_addr()): which host
    #: of the fleet ran the job (NULL over a Unix socket).
    client_addr = models.GenericIPAddressField(null=True)
    written_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"job {self.job_id} from {self.client_addr}"
