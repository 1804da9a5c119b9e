"""Key rotation for encrypted jobs (``gator_rotate_keys``): every sealed value of the job
rows (arguments, result, checkpoint, error texts) sealed again with the newest key of
``GATOR_ENCRYPTION_KEYS``.

Rows go by primary key, a batch at a time, each row's rewrite one UPDATE in autocommit that
is a compare-and-set on the values read: each value it replaces must still hold the token
that was read (a Fernet token is never made twice: a value written again has a new one),
and an error history must still have the entries read (it only grows). A column a worker
wrote meanwhile (a result, a checkpoint, an error) fails the comparison; the row is read
again and its new values are sealed again. Workers keep running throughout; nothing they
write is overwritten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from django.db.models import Q

from django_gator import encryption
from django_gator.exceptions import Undecryptable
from django_gator.models.jobs import Job
from django_gator.registry import registered_jobs

#: The JSON columns that may hold sealed values.
COLUMNS = ("args", "kwargs", "result", "checkpoint_data", "errors")
#: Reads of one row before the rotation gives up on it (a row rewritten that often by
#: workers while being rotated is reported, and left for the next run).
MAX_TRIES = 5


@dataclasses.dataclass
class Rotation:
    """What a rotation did: rows re-sealed, rows read again because a worker changed them
    meanwhile, and the rows it could not open (id and error) or kept missing."""

    key_id: str
    examined: int = 0
    resealed: int = 0
    reread: int = 0
    undecryptable: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    contended: list[int] = dataclasses.field(default_factory=list)


def encrypted_names() -> list[str]:
    """The names of the registered job classes with ``encrypted = True``."""
    return sorted(cls.name for cls in registered_jobs().values() if cls.traits.encrypted)


def rotate(alias: str, *, batch_size: int, names: Iterable[str] | None = None) -> Rotation:
    """Re-seal the rows of the jobs named ``names`` (default: the encrypted classes') in
    ``alias`` with the newest key; EncryptionUnavailable when there is none."""
    ring = encryption.keyring()
    report = Rotation(ring.newest)
    wanted = encrypted_names() if names is None else sorted(set(names))
    jobs = Job.objects.using(alias)
    last = 0
    while True:
        batch = list(
            jobs.filter(pk__gt=last, name__in=wanted)
            .order_by("pk")
            .values("pk", "name", *COLUMNS)[:batch_size]
        )
        if not batch:
            return report
        for row in batch:
            report.examined += 1
            _rotate_row(jobs, row, ring, report)
        last = batch[-1]["pk"]


def _rotate_row(jobs: Any, row: dict[str, Any], ring: encryption.Keyring, report: Rotation) -> None:
    """Re-seal one row, reading it again after each compare-and-set that missed."""
    for _ in range(MAX_TRIES):
        try:
            changes = _resealed(row, ring)
        except Undecryptable as exc:
            report.undecryptable.append((row["pk"], str(exc)))
            return
        if not changes:
            return
        if jobs.filter(_unchanged(row, changes)).update(**changes):
            report.resealed += 1
            return
        report.reread += 1
        fresh = jobs.filter(pk=row["pk"]).values("pk", "name", *COLUMNS).first()
        if fresh is None:  # deleted meanwhile (pruned, or by an operator): nothing to do
            return
        row = fresh
    report.contended.append(row["pk"])


def _unchanged(row: dict[str, Any], changes: dict[str, Any]) -> Q:
    """The row still holds what was read of the columns in ``changes``: each sealed value
    its token, the error history its entries (and no more)."""
    same = Q(pk=row["pk"])
    for column in changes:
        if column != "errors":
            same &= Q(**{f"{column}__data": row[column]["data"]})
            continue
        entries = row["errors"]
        same &= Q(**{f"errors__{len(entries)}__isnull": True})
        for index, entry in enumerate(entries):
            for field in encryption.ERROR_FIELDS:
                value: Any = entry.get(field) if isinstance(entry, dict) else None
                if encryption.is_sealed(value):
                    same &= Q(**{f"errors__{index}__{field}__data": value["data"]})
    return same


def _resealed(row: dict[str, Any], ring: encryption.Keyring) -> dict[str, Any]:
    """The columns of ``row`` that change: each sealed value sealed with the newest key."""
    what = f"job {row['pk']} ({row['name']})"
    changes: dict[str, Any] = {}
    for column in ("args", "kwargs", "result", "checkpoint_data"):
        value = row[column]
        if encryption.is_sealed(value):
            new = encryption.reseal(value, ring, f"the {column} of {what}")
            if new is not value:
                changes[column] = new
    errors = row["errors"]
    if isinstance(errors, list):
        new_errors = [_resealed_entry(entry, ring, f"an error of {what}") for entry in errors]
        if any(new is not old for new, old in zip(new_errors, errors, strict=True)):
            changes["errors"] = new_errors
    return changes


def _resealed_entry(entry: Any, ring: encryption.Keyring, what: str) -> Any:
    """An error-history entry with its sealed fields sealed with the newest key (the same
    object when none changes)."""
    if not isinstance(entry, dict):
        return entry
    fields = {
        field: encryption.reseal(entry[field], ring, what)
        for field in encryption.ERROR_FIELDS
        if encryption.is_sealed(entry.get(field))
    }
    if all(fields[field] is entry[field] for field in fields):
        return entry
    return {**entry, **fields}
