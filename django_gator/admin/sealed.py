"""The encrypted data of a job on its admin page (see :mod:`django_gator.encryption`).

A user with the permission ``django_gator.view_encrypted`` sees it decrypted; anyone else
sees ``[encrypted]`` in its place. Either way the page works on its own copy of the row:
the values are replaced on the object it shows, never written back (the admin never saves
a job; its actions write through queries of their own).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest

from django_gator.encryption import ERROR_FIELDS, SHOWN, holds_sealed, is_sealed, open_value
from django_gator.exceptions import Undecryptable
from django_gator.models import Job

#: The permission that shows encrypted jobs' data decrypted.
PERMISSION = "django_gator.view_encrypted"
#: The job's JSON columns that may hold sealed values.
COLUMNS = ("args", "kwargs", "result", "checkpoint_data")


def open_for(request: HttpRequest, job: Job) -> None:
    """Replace each sealed value of ``job`` (in memory) with what it holds, for a user
    with PERMISSION, or with SHOWN. A value that cannot be decrypted stays SHOWN, and a
    warning on the page names its key id."""
    allowed: bool | None = None
    problems: list[str] = []

    def shown(value: Any, what: str) -> Any:
        nonlocal allowed
        if not is_sealed(value):
            return value
        if allowed is None:
            allowed = request.user.has_perm(PERMISSION)
        if not allowed:
            return SHOWN
        try:
            return open_value(value, what)
        except Undecryptable as exc:
            problems.append(str(exc))
            return SHOWN

    for column in COLUMNS:
        value = getattr(job, column)
        if is_sealed(value):
            setattr(job, column, shown(value, f"the {column} of job {job.pk}"))
        elif column == "kwargs" and holds_sealed(value):  # encrypted = [names]
            what = f"the kwargs of job {job.pk}"
            setattr(job, column, {k: shown(v, f"{what} ({k!r})") for k, v in value.items()})
    if isinstance(job.errors, list):
        job.errors = [
            {**e, **{f: shown(e.get(f), f"an error of job {job.pk}") for f in ERROR_FIELDS}}
            if isinstance(e, dict) and any(is_sealed(e.get(f)) for f in ERROR_FIELDS)
            else e
            for e in job.errors
        ]
    for problem in dict.fromkeys(problems):
        messages.warning(request, problem)
