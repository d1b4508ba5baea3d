"""Kineto microseconds -> int64 ns in bulk: the same values as one by one, epoch times included."""

from __future__ import annotations

import numpy as np
import pytest

from tracing.ingest.kineto_time import us_text_to_ns, us_values_to_ns

INT64_MAX = np.iinfo(np.int64).max


@pytest.mark.parametrize("decimals", [1, 2, 3])
def test_epoch_microseconds_in_bulk_equal_one_by_one(decimals):
    rng = np.random.default_rng(decimals)
    whole = rng.integers(1_600_000_000_000_000, 1_800_000_000_000_000, 500)  # 16 digits: epoch us
    frac = rng.integers(0, 10**decimals, 500)
    values = [f"{w}.{f:0{decimals}d}" for w, f in zip(whole, frac, strict=True)]
    values += ["-12." + "5" * decimals, "0." + "0" * decimals]
    got = us_values_to_ns(values)
    assert got.dtype == np.int64
    assert got.tolist() == [us_text_to_ns(v) for v in values]


@pytest.mark.parametrize(
    "big", ["9223372036854775.808", "9999999999999999.999", "-9999999999999999.999", "9223372036854775.81"]
)
def test_a_value_beyond_int64_ns_is_not_saturated(big):
    # the bulk parse saturates at int64's bounds (and a scale to ns can overflow); such a batch goes value by
    # value, which refuses the value
    decimals = len(big) - big.index(".") - 1
    with pytest.raises((OverflowError, ValueError)):
        us_values_to_ns(["1700000000000000." + "1" * decimals, big])


def test_the_largest_value_that_fits_is_exact():
    values = ["9223372036854775.807", "1700000000000000.123"]
    assert us_values_to_ns(values).tolist() == [INT64_MAX, 1_700_000_000_000_000_123]
