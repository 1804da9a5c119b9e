"""The first steps of the pipeline for one dispatch call: check the job's options and its
items' arguments, and encode them into the rows' columns (:class:`~django_gator.rows.JobRows`).
No database access: a bad dispatch raises here, before anything is written or deferred."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django_gator import collector, conf, encryption, fairness, limits, payload, validation
from django_gator.exceptions import EncryptionUnavailable
from django_gator.registry import is_registered
from django_gator.rows import JobRows

if TYPE_CHECKING:
    from collections.abc import Callable

    from django_gator.queueable import Queueable

#: The arguments as the returned jobs hold them (copies of the caller's), by column.
Payloads = tuple[list[list[Any]], list[dict[str, Any]]]

#: A dispatch_many of at least this many items whose arguments all fit handle() has their
#: JSON checked and encoded while the rows are sent, on engines that stream them
#: (PostgreSQL's COPY), instead of before (see JobRows.encode).
STREAM_MIN_ROWS = 2000


def job_rows(
    job_class: type[Queueable],
    items: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    wait: timedelta | float | None,
    at: datetime | None,
    queue: str | None,
    priority: int | None,
    chain: tuple[str, int, str] | None,
    many: bool,
) -> tuple[JobRows, Payloads]:
    """Validate a dispatch and build its rows (no database access); returns them with the
    arguments as the returned jobs will hold them (copies of the caller's)."""
    if not is_registered(job_class):
        raise TypeError(
            f"{job_class.__qualname__} is not a registered job (an abstract base?); "
            "dispatch a concrete subclass"
        )
    queue = validation.validate_queue(job_class.queue if queue is None else queue)
    priority = validation.validate_priority(job_class.priority if priority is None else priority)
    run_at = validation.resolve_when(wait=wait, at=at)
    chain_id, chain_position, chain_json = chain if chain else (None, None, None)
    limit = conf.max_payload_bytes()
    with collector.paused(len(items)):
        args_col = [list(args) for args, _ in items]
        kwargs_col = [dict(kwargs) if kwargs else {} for _, kwargs in items]
        streamed = _streamed(job_class, args_col, kwargs_col, limit, many)
        if streamed is not None:
            args_json, kwargs_json, encode = streamed
        else:
            args_json, kwargs_json = _payloads(job_class, args_col, kwargs_col, limit, many)
            encode = None
        rows = JobRows(
            name=job_class.name,
            queue=queue,
            priority=priority,
            run_at=run_at,
            args=args_json,
            kwargs=kwargs_json,
            chain_id=chain_id,
            chain_position=chain_position,
            chain=chain_json,
            encode=encode,
        )
        traits = job_class.traits
        if traits.is_limited or traits.is_unique or traits.is_fair:
            _keys(job_class, queue, rows, args_col, kwargs_col, many)
        if job_class.traits.encrypted:
            _seal(job_class, rows)
    return rows, (args_col, kwargs_col)


def _seal(job_class: type[Queueable], rows: JobRows) -> None:
    """Replace the rows' arguments with their sealed envelopes, and their unique keys
    with keyed digests (see :mod:`django_gator.encryption`); EncryptionUnavailable, naming
    the class, when there are no keys to seal them with."""
    try:
        ring = encryption.keyring()
    except EncryptionUnavailable as exc:
        raise EncryptionUnavailable(
            f"{job_class.__qualname__} has encrypted = True, but {exc}; nothing was dispatched"
        ) from None
    seal = ring.seal
    dumps = encryption.envelope_json
    listed = job_class.traits.sealed_kwargs
    if listed is None:
        rows.args = [dumps(seal(text)) for text in rows.args]
        rows.kwargs = [dumps(seal(text)) for text in rows.kwargs]
    else:
        _refuse_positional(job_class, listed, rows.args)
        rows.kwargs = [encryption.seal_fields(text, listed) for text in rows.kwargs]
    if rows.unique_keys is not None:
        rows.unique_keys = [
            None if key is None else encryption.digest(key) for key in rows.unique_keys
        ]


def _refuse_positional(
    job_class: type[Queueable], listed: tuple[str, ...], args: list[str]
) -> None:
    """TypeError when an argument that ``encrypted`` lists would be passed positionally
    (positional arguments are stored in clear)."""
    positions = [
        index
        for index, p in enumerate(job_class.traits.signature.parameters.values())
        if p.name in listed and p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    if not positions:
        return
    for text in args:
        if text != "[]" and len(json.loads(text)) > min(positions):
            name = list(job_class.traits.signature.parameters)[min(positions)]
            raise TypeError(
                f"{job_class.__qualname__}.encrypted lists {name!r}: pass it by keyword "
                f"({name}=...), as arguments passed by position are stored in clear"
            )


def _streamed(
    job_class: type[Queueable],
    args_col: list[list[Any]],
    kwargs_col: list[dict[str, Any]],
    limit: int,
    many: bool,
) -> tuple[list[str], list[str], Callable[[int, int], None]] | None:
    """For a large dispatch_many whose items all fit handle(): placeholder columns and the
    callback that checks and encodes a range of them as an engine that streams the rows
    sends them (see JobRows.encode), so the checks overlap the database's work on the rows
    sent. None when the arguments are to be checked and encoded now."""
    if (
        not many
        or len(args_col) < STREAM_MIN_ROWS
        or job_class.traits.is_limited
        or job_class.traits.is_unique
        or job_class.traits.encrypted
        or job_class.misfits(args_col, kwargs_col)
    ):
        return None
    # "" (never JSON) until encoded; without keyword arguments, every row's "{}".
    count = len(args_col)
    args_json: list[str] = [""] * count
    keywords = any(kwargs_col)
    kwargs_json = [""] * count if keywords else ["{}"] * count
    encode = functools.partial(
        _encode_range, args_col, kwargs_col, limit, args_json, kwargs_json if keywords else None
    )
    return args_json, kwargs_json, encode


def _encode_range(
    args_col: list[list[Any]],
    kwargs_col: list[dict[str, Any]],
    limit: int,
    args_json: list[str],
    kwargs_json: list[str] | None,
    start: int,
    stop: int,
) -> None:
    """Check and encode the arguments of items ``start`` to ``stop`` (whose shapes fit
    handle(): see _streamed) into ``args_json`` and ``kwargs_json`` (None: no item has
    keyword arguments); raises for the first bad one, its message naming its index in the
    whole dispatch_many."""
    with collector.paused(stop - start):
        chunk_args, chunk_kwargs = args_col[start:stop], kwargs_col[start:stop]
        encoded_args, encoded_kwargs, doubtful = payload.encode_columns(
            chunk_args, chunk_kwargs, limit
        )
        for index in doubtful:
            try:
                encoded_args[index], encoded_kwargs[index] = payload.encode_payload(
                    chunk_args[index], chunk_kwargs[index], limit
                )
            except (TypeError, ValueError) as exc:
                _name_item(exc, start + index, True)
                raise
        args_json[start:stop] = encoded_args
        if kwargs_json is not None:
            kwargs_json[start:stop] = encoded_kwargs


def _payloads(
    job_class: type[Queueable],
    args_col: list[list[Any]],
    kwargs_col: list[dict[str, Any]],
    limit: int,
    many: bool,
) -> tuple[list[str], list[str]]:
    """Check that each item's arguments fit handle() and are JSON; returns their JSON. The
    checks run a column at a time (see payload.encode_columns and Queueable.misfits);
    the items they cannot clear at once are checked one by one, in order, so the error
    raised is the one of the first bad item, as if every item had been checked in turn. A
    single item is checked as it is."""
    if len(args_col) == 1:
        try:
            job_class.check_arguments(args_col[0], kwargs_col[0])
            args_json, kwargs_json = payload.encode_payload(args_col[0], kwargs_col[0], limit)
        except (TypeError, ValueError) as exc:
            _name_item(exc, 0, many)
            raise
        return [args_json], [kwargs_json]
    misfits = job_class.misfits(args_col, kwargs_col)
    args_col_json, kwargs_col_json, doubtful = payload.encode_columns(args_col, kwargs_col, limit)
    if misfits or doubtful:
        misfit = set(misfits)
        for index in sorted(misfit.union(doubtful)):
            args, kwargs = args_col[index], kwargs_col[index]
            try:
                if index in misfit:
                    job_class.check_arguments(args, kwargs)  # raises
                args_col_json[index], kwargs_col_json[index] = payload.encode_payload(
                    args, kwargs, limit
                )
            except (TypeError, ValueError) as exc:
                _name_item(exc, index, many)
                raise
    return args_col_json, kwargs_col_json


def _keys(
    job_class: type[Queueable],
    queue: str,
    rows: JobRows,
    args_col: list[list[Any]],
    kwargs_col: list[dict[str, Any]],
    many: bool,
) -> None:
    """The rows' unique keys, flow-control keys and fairness keys, from the class's
    methods."""
    traits = job_class.traits
    keyer = (
        job_class(queue=queue) if traits.is_unique or traits.is_keyed or traits.is_fair else None
    )
    unique_keys: list[str | None] = []
    flow_keys: list[str | None] = []
    fair_keys: list[str | None] = []
    for index, (args, kwargs) in enumerate(zip(args_col, kwargs_col, strict=True)):
        try:
            flow_keys.append(limits.flow_key(job_class, keyer, args, kwargs))
            if keyer is not None and traits.is_fair:
                fair_keys.append(
                    fairness.validate_key(keyer.fairness_key(*args, **kwargs), job_class.name)
                )
            if keyer is not None and job_class.traits.is_unique:
                unique_keys.append(
                    validation.validate_unique_key(
                        keyer.unique_key(*args, **kwargs), job_class.name
                    )
                )
        except (TypeError, ValueError) as exc:
            _name_item(exc, index, many)
            raise
    if job_class.traits.is_limited:
        rows.concurrency_keys = flow_keys
    if unique_keys:
        rows.unique_keys = unique_keys
    if fair_keys:
        rows.fairness_keys = fair_keys


def _name_item(exc: Exception, index: int, many: bool) -> None:
    """Prefix the message of ``exc`` with the item's index, for dispatch_many."""
    if many:
        exc.args = (f"dispatch_many() item {index}: {exc}", *exc.args[1:])
