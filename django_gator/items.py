"""dispatch_many()'s items, each a list of positional arguments or a dict of keyword
ones, as the (args, kwargs) pairs that dispatch and workflows' batch steps take."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence, Sized
from types import MappingProxyType
from typing import Any, cast

from django_gator import collector
from django_gator.wording import article

#: The kwargs of an item given as a list (read only: shared by every such item).
_NO_KWARGS: Mapping[str, Any] = MappingProxyType({})
_SEQUENCES = frozenset({list, tuple})


def dispatch_items(
    arguments: Iterable[Sequence[Any] | Mapping[str, Any]], caller: str = "dispatch_many()"
) -> list[tuple[Sequence[Any], Mapping[str, Any]]]:
    """dispatch_many()'s items as (args, kwargs) pairs (``caller`` names the call in the
    error about an item that is neither). With the garbage collector paused when they are
    many (see collector.paused)."""
    with collector.paused(len(arguments) if isinstance(arguments, Sized) else None):
        if isinstance(arguments, list) and _SEQUENCES.issuperset(map(type, arguments)):
            return list(zip(arguments, itertools.repeat(_NO_KWARGS), strict=False))
        items: list[tuple[Sequence[Any], Mapping[str, Any]]] = []
        append = items.append
        for index, item in enumerate(arguments):
            kind = type(item)
            if kind is list or kind is tuple:  # the usual case, before the slower ABC check
                append((cast(Sequence[Any], item), _NO_KWARGS))
            elif isinstance(item, Mapping):
                append(((), item))
            elif isinstance(item, list | tuple):
                append((item, _NO_KWARGS))
            else:
                raise TypeError(
                    f"{caller} item {index} is {article(type(item).__name__)}; "
                    "pass a list of positional arguments or a dict of keyword arguments"
                )
        return items
