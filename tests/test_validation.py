"""The validators dispatch runs before anything reaches the database, as pure functions."""

from __future__ import annotations

import json
import math
import re
import sys
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from django_gator.exceptions import PayloadTooLarge
from django_gator.payload import encode_payload
from django_gator.validation import (
    MAX_INT_BITS,
    check_json,
    resolve_when,
    validate_name,
    validate_priority,
    validate_queue,
    validate_timeout,
)

pure = hsettings(database=None, deadline=None)

# -- check_json against the real round trip --------------------------------------------------


def round_trips_identically(value: object) -> bool:
    """The oracle: strict JSON (no NaN/Infinity) gives back an equal value of the same shape,
    and every database can store it (no NUL or lone surrogate in any string, no float that
    PostgreSQL's jsonb would return as an int), and it is within the documented bound on ints
    (MAX_INT_BITS: 2**14001 still round-trips through Python's json, but is refused)."""
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return _same(json.loads(text), value) and _storable(value)


def _storable(value: object) -> bool:
    if isinstance(value, str):
        return re.search("[\x00\ud800-\udfff]", value) is None
    if isinstance(value, float):
        return abs(value) < 1e16
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() <= MAX_INT_BITS
    if isinstance(value, list):
        return all(map(_storable, value))
    if isinstance(value, dict):
        return all(_storable(k) and _storable(v) for k, v in value.items())
    return True


def _same(back: object, sent: object) -> bool:
    if type(back) is not type(sent):
        return False
    if isinstance(sent, list):
        assert isinstance(back, list)
        return len(back) == len(sent) and all(map(_same, back, sent))
    if isinstance(sent, dict):
        assert isinstance(back, dict)
        return back.keys() == sent.keys() and all(_same(back[k], sent[k]) for k in sent)
    return back == sent


clean_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8
)
json_atoms = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(min_value=-9.99e15, max_value=9.99e15),
    clean_text,
    st.sampled_from(["é", "\u2028", "\U0001f40a"]),
)
bad_atoms = st.one_of(
    # Round-trip through Python's json, but no database column holds them as sent.
    st.sampled_from(["\ud800", "a\x00b", 1e16, -2.5e300]),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.binary(max_size=4),
    st.decimals(allow_nan=False, places=2),
    st.datetimes(),
    st.dates(),
    st.frozensets(st.integers(), max_size=3),
    st.sets(st.integers(), max_size=3),
    st.builds(object),
)
odd_keys = st.one_of(
    st.integers(),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    st.tuples(st.integers()),
    st.sampled_from(["1", "true", "null", "1.5"]),  # what the odd keys turn into
)
mixed_values = st.recursive(
    st.one_of(json_atoms, bad_atoms),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=5), children, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=3), odd_keys), children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
    ),
    max_leaves=12,
)


@pure
@given(mixed_values)
def test_check_json_accepts_exactly_what_round_trips_through_json(value):
    expected = round_trips_identically(value)

    try:
        check_json(value, "root")
        refusal = None
    except TypeError as exc:
        refusal = str(exc)
    if expected:
        assert refusal is None, f"refused a value that round-trips: {refusal}"
    else:
        assert refusal is not None, "accepted a value that does not round-trip"
        assert refusal.startswith("root")


@pure
@given(
    st.recursive(
        json_atoms,
        lambda children: st.one_of(
            st.lists(children, max_size=4), st.dictionaries(clean_text, children)
        ),
        max_leaves=20,
    )
)
def test_check_json_accepts_every_json_value(value):
    check_json(value, "args")
    check_json([value], "args")
    check_json({"k": value}, "kwargs")


@st.composite
def one_offender_inside_json(draw: Any) -> tuple[object, str, str]:
    """(value, path of the only offender, what the message says about it)."""
    if draw(st.booleans()):
        bad_key = draw(odd_keys.filter(lambda k: not isinstance(k, str)))
        current: object = {bad_key: draw(json_atoms)}
        tail = f" has the key {bad_key!r}"
    else:
        current = draw(bad_atoms)
        tail = " "
    path = ""
    for _ in range(draw(st.integers(0, 6))):
        siblings = draw(st.lists(json_atoms, max_size=3))
        if draw(st.booleans()):
            index = draw(st.integers(0, len(siblings)))
            siblings.insert(index, current)
            current, path = siblings, f"[{index}]{path}"
        else:
            key = draw(clean_text)
            container = {f"sibling{i}": v for i, v in enumerate(siblings)}
            container[key] = current
            current, path = container, f"[{key!r}]{path}"
    return current, path, tail


@pure
@given(one_offender_inside_json())
def test_the_error_names_the_exact_path_of_the_offender(case):
    value, path, tail = case

    with pytest.raises(TypeError) as excinfo:
        check_json(value, "args")

    assert str(excinfo.value).startswith(f"args{path}{tail}")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (datetime(2030, 1, 1, tzinfo=UTC), "args[0] is a datetime.datetime (datetime.datetime("),
        (Decimal("1.5"), "args[0] is a decimal.Decimal (Decimal('1.5'))"),
        ({1}, "args[0] is a set ({1})"),
        (b"\x00", "args[0] is a bytes (b'\\x00')"),
        ((1, 2), "args[0] is a tuple ((1, 2)), which does not round-trip through JSON (tuples"),
        (math.nan, "args[0] is nan, which JSON cannot represent"),
        (-math.inf, "args[0] is -inf, which JSON cannot represent"),
        ({2: "x"}, "args[0] has the key 2 of type int; JSON object keys must be str"),
        ({"a": {"when": date(2030, 1, 1)}}, "args[0]['a']['when'] is a datetime.date"),
        (object(), "args[0] is an object (<object object at"),
        (type("Order", (), {"__module__": "orders.models"})(), "args[0] is an orders.models.Order"),
        ("x" * 10 + "\x00", "args[0] contains the character '\\x00' at index 10"),
        (1e16, "args[0] is the float 1e+16; PostgreSQL's jsonb hands floats"),
    ],
)
def test_check_json_messages(value, message):
    if message is None:
        check_json([value], "args")
        return
    with pytest.raises(TypeError) as excinfo:
        check_json([value], "args")
    assert str(excinfo.value).startswith(message)


def test_check_json_names_long_values_briefly():
    with pytest.raises(TypeError) as excinfo:
        check_json([b"x" * 10_000], "args")

    assert len(str(excinfo.value)) < 400
    assert "b'xxxxxxxx" in str(excinfo.value)


def test_an_int_too_long_for_json_is_refused_naming_its_path():
    with pytest.raises(TypeError, match=r"^args\[0\]"):
        encode_payload([10**5000], {})


def test_nesting_too_deep_to_encode_is_refused_naming_its_path():
    deep: list[Any] = []
    for _ in range(sys.getrecursionlimit() * 2):
        deep = [deep]

    with pytest.raises(TypeError, match=r"^args\[0\]"):
        encode_payload([deep], {})


def test_a_lone_surrogate_is_refused_naming_its_path():
    with pytest.raises(TypeError, match=r"^kwargs\['s'\]"):
        encode_payload([], {"s": "ok \ud83d"})


# -- encode_payload --------------------------------------------------------------------------


def test_encode_payload_writes_compact_utf8_json():
    args_json, kwargs_json = encode_payload((1, "é", {"a": None}, [1.5]), {"k": [True]})

    assert args_json == '[1,"é",{"a":null},[1.5]]'
    assert kwargs_json == '{"k":[true]}'
    assert encode_payload((), {}) == ("[]", "{}")


def test_encode_payload_limit_counts_utf8_bytes_of_both_parts(settings):
    # '["' + 6 + '"]' + '{"k":1}' = 10 + 7 = 17 bytes.
    assert encode_payload(["ééé"], {"k": 1}, 17)
    with pytest.raises(PayloadTooLarge, match=r"^job payload is 17 bytes, over .*=16;"):
        encode_payload(["ééé"], {"k": 1}, 16)

    settings.GATOR_MAX_PAYLOAD_BYTES = 16
    with pytest.raises(PayloadTooLarge, match=r"GATOR_MAX_PAYLOAD_BYTES=16"):
        encode_payload(["ééé"], {"k": 1})


def test_encode_payload_checks_args_and_kwargs_separately():
    with pytest.raises(TypeError, match=r"^args\[1\] is a set"):
        encode_payload([1, {2}], {})
    with pytest.raises(TypeError, match=r"^kwargs\['when'\] is a datetime\.date"):
        encode_payload([1], {"when": date(2030, 1, 1)})


# -- queue, priority, name, timeout, wait/at ---------------------------------------------------


@pytest.mark.parametrize("queue", ["default", "a", "A-Z_0.9:x", "q" * 100])
def test_valid_queue_names(queue):
    assert validate_queue(queue) == queue


@pytest.mark.parametrize(
    ("queue", "message"),
    [
        ("", "invalid queue name ''"),
        ("a,b", "invalid queue name 'a,b'"),
        ("high,3", "invalid queue name 'high,3'"),
        ("tab\t", "invalid queue name 'tab\\t'"),
        ("ünï", "invalid queue name 'ünï'"),
        ("q" * 101, "invalid queue name 'qqqq"),
        (None, "queue name must be a str, got None"),
        (["default"], "queue name must be a str, got ['default']"),
    ],
)
def test_invalid_queue_names(queue, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        validate_queue(queue)


@pure
@given(st.integers())
def test_priority_accepts_exactly_minus_100_to_100(priority):
    if -100 <= priority <= 100:
        assert validate_priority(priority) == priority
    else:
        with pytest.raises(ValueError, match=rf"^priority {priority} is out of range"):
            validate_priority(priority)


@pytest.mark.parametrize("priority", [True, False, 1.0, "1", None, Decimal(1)])
def test_priority_must_be_an_int(priority):
    with pytest.raises(ValueError, match=r"^priority must be an int, got "):
        validate_priority(priority)


@pytest.mark.parametrize("name", ["", "x" * 256, "a\nb", "a\rb", "a\x00b", None, 7])
def test_invalid_job_names(name):
    with pytest.raises(ValueError, match=r"job name must"):
        validate_name(name)


def test_valid_timeouts():
    assert validate_timeout(None) is None
    assert validate_timeout(60) == 60.0
    assert validate_timeout(0.5) == 0.5


@pytest.mark.parametrize("timeout", [0, -1, math.nan, math.inf, True, "60"])
def test_invalid_timeouts(timeout):
    with pytest.raises(ValueError, match=r"^timeout must be"):
        validate_timeout(timeout)


def test_resolve_when():
    assert resolve_when() is None
    assert resolve_when(wait=0) is None
    at = datetime(2030, 1, 1, tzinfo=UTC)
    assert resolve_when(at=at) is at
    before = timezone.now()
    when = resolve_when(wait=timedelta(minutes=5))
    after = timezone.now()
    assert when is not None
    assert before + timedelta(minutes=5) <= when <= after + timedelta(minutes=5)
    assert when.tzinfo is not None


@pytest.mark.parametrize("wait", [10**12, 1e300, timedelta.max], ids=["1e12", "1e300", "max"])
def test_a_wait_beyond_the_calendar_is_a_value_error_naming_it(wait):
    with pytest.raises(ValueError, match=r"wait="):
        resolve_when(wait=wait)
