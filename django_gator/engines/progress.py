"""The statements of long-running jobs: an attempt's progress and checkpoint, written on
its claim, and the checkpoint read back by the next attempt."""

from __future__ import annotations

import json

from django_gator.attempts import Claim
from django_gator.engines.core import EngineCore


class ProgressStatements(EngineCore):
    """Progress and checkpoints of running jobs."""

    #: A JSON value as a query parameter (PostgreSQL casts it).
    _json_param = "%s"

    def save_progress(
        self,
        worker_id: str,
        claim: Claim,
        progress: str | None,
        checkpoint: str | None,
        logs: str | None = None,
    ) -> bool:
        """Write ``progress`` and/or ``checkpoint`` (JSON texts; None leaves that column
        as it is), and append ``logs`` (an attempt's captured-logs entry, JSON text) to the
        ``logs`` array, on ``claim``: a compare-and-set, by primary key, that writes only while
        the row is still ``running`` for ``worker_id`` at the claim's attempt. False,
        writing nothing, if refused (or if there is nothing to write). One UPDATE, in the
        caller's transaction when one is open (an atomic job's)."""
        sets, params = [], []
        if progress is not None:
            sets.append(f"progress = {self._json_param}")
            params.append(progress)
        if checkpoint is not None:
            sets.append(f"checkpoint_data = {self._json_param}")
            params.append(checkpoint)
        if logs is not None:
            sets.append(f"logs = {self.json_append_sql('logs')}")
            params.append(logs)
        if not sets:
            return False
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {self._cas_table} SET {', '.join(sets)} WHERE {self._claim_match}",
                [*params, claim.id, claim.attempts, worker_id],
            )
            return bool(cursor.rowcount == 1)

    def read_checkpoint(self, job_id: int) -> str | None:
        """The checkpoint of job ``job_id``, as JSON text (None: none, or no such row).
        One SELECT by primary key."""
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT checkpoint_data FROM {self.job_table} WHERE id = %s", [job_id])
            row = cursor.fetchone()
        if row is None or row[0] is None:
            return None
        value = row[0]
        if isinstance(value, (bytes, bytearray)):
            return value.decode()
        if isinstance(value, str):
            return value
        return json.dumps(value)  # a driver that decodes JSON itself
