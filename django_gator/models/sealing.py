"""Key rotation for encrypted jobs (``gator_rotate_keys``): every sealed value of the job
rows (arguments, result, checkpoint, error texts) sealed again with the newest key of
``GATOR_ENCRYPTION_KEYS``, and unique keys digested again under it.

Rows go by primary key, a batch at a time, each row's rewrite one UPDATE in a transaction
of its own that is a compare-and-set on the values read: each value it replaces must still
hold the token that was read (a Fernet token is never made twice: a value written again has
a new one), an error history must still have the entries read (it only grows), the unique
key its digest. A column a worker wrote meanwhile (a result, a checkpoint, an error) fails
the comparison; the row is read again and its new values are sealed again. Workers keep
running throughout; nothing they write is overwritten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q

from django_gator import encryption
from django_gator.exceptions import JobNotRegistered, Undecryptable
from django_gator.models.jobs import Job
from django_gator.registry import get_job_class, registered_jobs
from django_gator.validation import validate_unique_key

#: The JSON columns that may hold sealed values.
COLUMNS = ("args", "kwargs", "result", "checkpoint_data", "errors")
#: What a rotation reads of a row: those, and the unique key (a digest under some key).
READ = ("pk", "name", "queue", "unique_key", *COLUMNS)
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
    #: Rows whose unique key's new digest an active job holds already (left as it was).
    clashes: list[int] = dataclasses.field(default_factory=list)


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
            jobs.filter(pk__gt=last, name__in=wanted).order_by("pk").values(*READ)[:batch_size]
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
        if _update(jobs, row, changes, report):
            report.resealed += 1
            return
        report.reread += 1
        fresh = jobs.filter(pk=row["pk"]).values(*READ).first()
        if fresh is None:  # deleted meanwhile (pruned, or by an operator): nothing to do
            return
        row = fresh
    report.contended.append(row["pk"])


def _update(jobs: Any, row: dict[str, Any], changes: dict[str, Any], report: Rotation) -> bool:
    """The compare-and-set of ``changes``; whether it landed. A unique key digested under
    the new key that an active job holds already (one dispatched after the new key was put
    first, with the same key) is left under the old key: both jobs stay, as they are."""
    try:
        with transaction.atomic(using=jobs.db):
            return bool(jobs.filter(_unchanged(row, changes)).update(**changes))
    except IntegrityError:
        if "unique_key" not in changes:
            raise
        report.clashes.append(row["pk"])
        kept = {column: value for column, value in changes.items() if column != "unique_key"}
        return not kept or bool(jobs.filter(_unchanged(row, kept)).update(**kept))


def _unchanged(row: dict[str, Any], changes: dict[str, Any]) -> Q:
    """The row still holds what was read of the columns in ``changes``: each sealed value
    its token, the error history its entries (and no more), the unique key its digest."""
    same = Q(pk=row["pk"])
    for column in changes:
        if column == "unique_key":
            same &= Q(unique_key=row["unique_key"])
            continue
        if column != "errors" and not encryption.is_sealed(row[column]):
            for name, field in row[column].items():  # listed kwargs: each its own token
                if encryption.is_sealed(field):
                    same &= Q(**{f"{column}__{name}__data": field["data"]})
            continue
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
        elif column == "kwargs" and encryption.holds_sealed(value):  # listed kwargs
            fields = {
                k: encryption.reseal(v, ring, f"the kwargs of {what}") for k, v in value.items()
            }
            if any(fields[k] is not value[k] for k in value):
                changes[column] = fields
    digest = _new_digest(row, ring)
    if digest is not None:
        changes["unique_key"] = digest
    errors = row["errors"]
    if isinstance(errors, list):
        new_errors = [_resealed_entry(entry, ring, f"an error of {what}") for entry in errors]
        if any(new is not old for new, old in zip(new_errors, errors, strict=True)):
            changes["errors"] = new_errors
    return changes


def _new_digest(row: dict[str, Any], ring: encryption.Keyring) -> str | None:
    """The row's unique key digested under the newest key, when it is a digest under an
    older one: worked out again from its arguments by its class's unique_key(). None when
    it stays (not a digest, the newest key's already, or the class is not registered)."""
    key = row["unique_key"]
    if not key or not key.startswith("hmac:") or key.startswith(f"hmac:{ring.newest}:"):
        return None
    try:
        job_class = get_job_class(row["name"])
    except JobNotRegistered:
        return None
    what = f"job {row['pk']} ({row['name']})"
    args, kwargs = encryption.open_payload(row["pk"], row["name"], row["args"], row["kwargs"])
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return None
    try:
        plain = validate_unique_key(job_class(queue=row["queue"]).unique_key(*args, **kwargs), what)
    except (TypeError, ValueError):  # as at dispatch; the row keeps its digest
        return None
    return None if plain is None else encryption.digest(plain)


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
