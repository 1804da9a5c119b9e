"""Queue specs (``-q critical,8``) and the weighted order a worker tries them in."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django_gator.validation import QUEUE_RE

MAX_WEIGHT = 1000


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    weight: int = 1
    #: Every job of the queue runs in a child process (``--isolate-queue``).
    isolated: bool = False


def parse_queue_spec(text: str) -> QueueSpec:
    """Parse ``NAME`` or ``NAME,WEIGHT``; ValueError names what is wrong."""
    name, sep, weight_text = text.partition(",")
    name = name.strip()
    if not name:
        raise ValueError(f"queue spec {text!r} has no queue name; use NAME or NAME,WEIGHT")
    if not QUEUE_RE.fullmatch(name) or len(name) > 100:
        raise ValueError(f"invalid queue name {name!r} in {text!r}")
    if not sep:
        return QueueSpec(name)
    weight_text = weight_text.strip()
    # Plain ASCII digits only: int() would also take "1_0", "+5" or other scripts' digits.
    digits = weight_text.removeprefix("-")
    if not digits.isascii() or not digits.isdigit():
        raise ValueError(f"queue weight {weight_text!r} in {text!r} is not a whole number")
    weight = int(weight_text)
    if not 1 <= weight <= MAX_WEIGHT:
        raise ValueError(f"queue weight {weight} in {text!r} must be from 1 to {MAX_WEIGHT}")
    return QueueSpec(name, weight)


def parse_queue_specs(texts: Iterable[str]) -> list[QueueSpec]:
    specs: list[QueueSpec] = []
    seen: set[str] = set()
    for text in texts:
        spec = parse_queue_spec(text)
        if spec.name in seen:
            raise ValueError(f"queue {spec.name!r} is listed twice")
        seen.add(spec.name)
        specs.append(spec)
    return specs


def weighted_order(specs: Sequence[QueueSpec], rng: random.Random | random.Random) -> list[str]:
    """All queue names, in a random order where each queue comes first with probability
    proportional to its weight (Efraimidis-Spirakis: sort by ``u ** (1 / weight)``,
    highest first). Trying the queues in this order means a weight-3 queue is served about
    three times as often as a weight-1 queue while both have work, and an empty queue never
    keeps the worker idle while a later one has work."""
    if len(specs) == 1:
        return [specs[0].name]
    if len({s.weight for s in specs}) == 1:
        names = [s.name for s in specs]
        rng.shuffle(names)
        return names
    keyed = [(rng.random() ** (1.0 / s.weight), s.name) for s in specs]
    keyed.sort(reverse=True)
    return [name for _, name in keyed]
