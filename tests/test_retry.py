"""Retry policies and backoff: pure functions of the retry count."""

from __future__ import annotations

import dataclasses
import math
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_gator import Retry
from django_gator.retry import (
    DEFAULT_MAX_RETRIES,
    EXPONENTIAL,
    JITTER,
    MAX_BACKOFF,
    delay_for,
    exponential_backoff,
    exponential_base,
    validate_interval,
)

pure = settings(database=None, deadline=None)
retry_counts = st.integers(min_value=0, max_value=10**6)
# First n where 30 + n**5 passes one week (14**5 = 537_824, 15**5 = 759_375).
FIRST_CAPPED = 15


class FixedRandom(random.Random):
    """random() always returns ``value``: the ends of the jitter range, exactly."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


# -- exponential_base ----------------------------------------------------------------------


def test_exponential_base_is_30_plus_n_to_the_fifth():
    assert [exponential_base(n) for n in range(7)] == [30, 31, 62, 273, 1054, 3155, 7806]
    assert exponential_base(14) == 30 + 14**5
    assert exponential_base(FIRST_CAPPED) == MAX_BACKOFF == 7 * 24 * 3600


@pure
@given(retry_counts, retry_counts)
def test_exponential_base_grows_monotonically(a, b):
    low, high = sorted((a, b))
    assert exponential_base(low) <= exponential_base(high)
    if high < FIRST_CAPPED and low < high:
        assert exponential_base(low) < exponential_base(high)


@pure
@given(st.integers(min_value=0, max_value=10**100))
def test_exponential_base_is_capped_at_max_backoff(n):
    base = exponential_base(n)
    assert isinstance(base, float)
    assert 30 <= base <= MAX_BACKOFF
    if n >= FIRST_CAPPED:
        assert base == MAX_BACKOFF
    else:
        assert base == 30 + n**5


@pytest.mark.parametrize("n", [-1, -100])
def test_exponential_base_refuses_negative_counts(n):
    with pytest.raises(ValueError, match=rf"retry_count must be >= 0, got {n}"):
        exponential_base(n)


# -- exponential_backoff -------------------------------------------------------------------


@pure
@given(retry_counts, st.randoms(use_true_random=False))
def test_exponential_backoff_stays_within_base_and_base_plus_ten_percent(n, rng):
    base = exponential_base(n)
    delay = exponential_backoff(n, rng)

    assert base <= delay <= base * (1 + JITTER) * (1 + 1e-12)
    assert delay <= MAX_BACKOFF


@pure
@given(retry_counts)
def test_exponential_backoff_with_the_global_random_is_bounded_too(n):
    base = exponential_base(n)
    assert base <= exponential_backoff(n) <= min(base * 1.1 * (1 + 1e-12), MAX_BACKOFF)


@pytest.mark.parametrize("n", range(FIRST_CAPPED))
def test_jitter_spans_the_whole_ten_percent_below_the_cap(n):
    base = exponential_base(n)

    assert exponential_backoff(n, FixedRandom(0.0)) == base
    highest = exponential_backoff(n, FixedRandom(1.0 - 2**-53))
    assert highest == pytest.approx(base * 1.1, rel=1e-12)
    assert highest <= MAX_BACKOFF


def test_jitter_spreads_jobs_that_failed_together():
    rng = random.Random(1234)
    delays = {exponential_backoff(5, rng) for _ in range(200)}

    assert len(delays) == 200
    assert max(delays) - min(delays) > exponential_base(5) * JITTER * 0.8


@pytest.mark.parametrize("n", [FIRST_CAPPED, 20, 1000])
def test_at_the_cap_the_delay_is_exactly_max_backoff(n):
    assert exponential_backoff(n, FixedRandom(1.0 - 2**-53)) == MAX_BACKOFF
    assert exponential_backoff(n, FixedRandom(0.0)) == MAX_BACKOFF


# -- Retry -----------------------------------------------------------------------------------


def test_retry_defaults():
    policy = Retry()
    assert (policy.interval, policy.max_retries, policy.queue) == (
        EXPONENTIAL,
        DEFAULT_MAX_RETRIES,
        None,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_retries = 3  # type: ignore[misc]


@pure
@given(st.integers(0, 50), st.integers(0, 200))
def test_allows_exactly_max_retries_retries(max_retries, retry_count):
    policy = Retry(interval=1, max_retries=max_retries)
    assert policy.allows(retry_count) is (retry_count < max_retries)


def test_allows_counts_retries_not_attempts():
    policy = Retry(interval=1, max_retries=2)
    assert [policy.allows(n) for n in range(4)] == [True, True, False, False]
    assert Retry(interval=1, max_retries=0).allows(0) is False


@pure
@given(st.integers(0, 10**9))
def test_max_retries_none_retries_forever(retry_count):
    assert Retry(max_retries=None).allows(retry_count) is True


@pure
@given(
    st.one_of(st.integers(0, 10**7), st.floats(0, 1e9, allow_nan=False, allow_infinity=False)),
    retry_counts,
)
def test_a_fixed_interval_is_the_same_delay_for_every_retry(interval, n):
    policy = Retry(interval=interval)
    assert policy.delay(n) == float(interval)
    assert isinstance(policy.delay(n), float)
    assert delay_for(interval, n) == float(interval)


@pure
@given(retry_counts)
def test_an_exponential_policy_delays_by_the_backoff(n):
    delay = Retry(interval="exponential").delay(n)
    assert exponential_base(n) <= delay <= exponential_base(n) * 1.1 * (1 + 1e-12)


def test_delay_takes_an_interval_override():
    policy = Retry(interval=300)
    assert policy.delay(3, interval=5) == 5.0
    assert exponential_base(3) <= policy.delay(3, interval="exponential") <= 273 * 1.1
    with pytest.raises(ValueError, match=r"got -5"):
        policy.delay(3, interval=-5)


@pytest.mark.parametrize(
    "interval",
    [
        -1,
        -0.5,
        -math.inf,
        math.inf,
        math.nan,
        "linear",
        "Exponential",
        "",
        "300",
        None,
        True,
        False,
        [300],
    ],
)
def test_invalid_intervals_are_refused_naming_the_value(interval):
    message = rf"^retry interval must be .*, got {re.escape(repr(interval))}$"
    with pytest.raises(ValueError, match=message):
        Retry(interval=interval)
    with pytest.raises(ValueError, match=message):
        validate_interval(interval)
    with pytest.raises(ValueError, match=message):
        delay_for(interval, 0)


@pure
@given(st.one_of(st.integers(max_value=-1), st.floats(max_value=-1e-300)))
def test_every_negative_interval_is_refused(interval):
    with pytest.raises(ValueError, match="retry interval must be"):
        Retry(interval=interval)


@pytest.mark.parametrize("max_retries", [-1, 1.5, "3", True, False, math.nan, math.inf])
def test_invalid_max_retries_are_refused_naming_the_value(max_retries):
    message = f"max_retries must be an int >= 0 or None, got {max_retries!r}"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Retry(max_retries=max_retries)


@pytest.mark.parametrize("queue", ["", "a,b", "with space", 7])
def test_an_invalid_retry_queue_is_refused_naming_it(queue):
    with pytest.raises(ValueError, match=repr(queue).replace(" ", r"\s")):
        Retry(queue=queue)


def test_valid_policies():
    assert Retry(interval=0, max_retries=0).delay(0) == 0.0
    assert Retry(interval=300, max_retries=5, queue="retries").queue == "retries"
    assert Retry(interval=2.5).delay(100) == 2.5
