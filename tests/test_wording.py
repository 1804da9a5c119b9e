"""User-facing English: counts with the right plural, "a" or "an" before type names."""

from __future__ import annotations

import pytest

from django_gator.wording import article, count


@pytest.mark.parametrize(
    ("number", "noun", "expected"),
    [
        (0, "job", "0 jobs"),
        (1, "job", "1 job"),
        (2, "job", "2 jobs"),
        (1, "dead job", "1 dead job"),
        (3, "dead or failed job", "3 dead or failed jobs"),
        (1, "batch", "1 batch"),
        (2, "batch", "2 batches"),
        (2, "entry", "2 entries"),
        (2, "key", "2 keys"),
        (12_345, "row", "12,345 rows"),
        (2, "person", "2 people"),
    ],
)
def test_count(number, noun, expected):
    plural = "people" if noun == "person" else None
    assert count(number, noun, plural) == expected


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("set", "a set"),
        ("int", "an int"),
        ("object", "an object"),
        ("orders.models.Order", "an orders.models.Order"),
        ("Order", "an Order"),
        ("datetime.datetime", "a datetime.datetime"),
        ("uuid.UUID", "a uuid.UUID"),
        ("unique key", "a unique key"),
        ("user", "a user"),
        ("underscore", "an underscore"),
        ("hour", "an hour"),
        ("", "a "),
    ],
)
def test_article(word, expected):
    assert article(word) == expected
