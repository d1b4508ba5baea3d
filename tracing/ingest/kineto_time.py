"""Kineto microseconds -> exact int64 nanoseconds, one value or a whole batch.

Kineto writes ``ts``/``dur`` in microseconds with up to 3 decimals (ns resolution), relative times reaching
~4.5e12 us on long-running hosts -- above 2^42 us, where a double's spacing (~0.001 us) no longer proves the
ns digit. So values arrive as the number's exact text (msgspec's ``float_hook=str``) and are converted without a
float step: ``"4458676522690.655"`` -> ``4458676522690655``.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import numpy as np


def us_text_to_ns(value: Any) -> int:
    """Microseconds (int, or the exact decimal text of a float) -> int ns, rounding half-even below 1 ns."""
    if type(value) is int:
        return value * 1000
    if type(value) is not str:
        raise TypeError(f"expected a number, got {type(value).__name__}")
    whole, dot, frac = value.partition(".")
    if (
        dot
        and len(frac) <= 3
        and frac.isdigit()
        and (whole.isdigit() or (whole[:1] == "-" and whole[1:].isdigit()))
    ):
        ns = int(whole.lstrip("-") or "0") * 1000 + int(frac.ljust(3, "0"))
        return -ns if whole.startswith("-") else ns
    try:
        d = Decimal(value)
    except ArithmeticError:  # decimal.InvalidOperation
        d = Decimal("NaN")
    if not d.is_finite():
        raise TypeError(f"not a finite number: {value!r}")
    if d.adjusted() > 18:  # int64 ns ends at ~9.2e15 us: "1e999999999" must not become a billion-digit int
        raise ValueError(f"{value!r} us does not fit in int64 ns")
    return int((d * 1000).to_integral_value(ROUND_HALF_EVEN))


# epoch microseconds have 16 digits; int64 ns ends at ~9.2e15 us, so a 16-digit value may not fit: the parse
# saturates at int64's bounds, and such a batch goes value by value (which says which value does not fit)
_US_TEXT = [re.compile(rf"(?:-?[0-9]{{1,16}}\.[0-9]{{{d}}}\n)*") for d in range(4)]
_INT64 = np.iinfo(np.int64)
_MAX_US_INT = _INT64.max // 1000


def us_values_to_ns(values: list[Any]) -> np.ndarray:
    """Microsecond values (ints, or float text) -> int64 ns, exactly as :func:`us_text_to_ns` per value.

    The common cases are converted in bulk with no float step: every value a Python int (``* 1000``, when
    all fit), or every value decimal text with the same number (1-3) of decimals as the first -- drop the
    dots, parse the digits as int64 and scale to ns. Anything else goes value by value.
    """
    first = values[0] if values else None
    if first.__class__ is int and all(v.__class__ is int for v in values):  # bool is not int here either
        try:
            arr = np.array(values, np.int64)
        except OverflowError:
            arr = None
        if arr is not None and arr.min() >= -_MAX_US_INT and arr.max() <= _MAX_US_INT:
            return arr * 1000
    elif first.__class__ is str and "." in first and 1 <= (decimals := len(first) - first.find(".") - 1) <= 3:
        try:
            text = "\n".join(values) + "\n"
        except TypeError:
            text = ""
        if text and _US_TEXT[decimals].fullmatch(text) is not None:
            out = np.fromstring(text.replace(".", ""), dtype=np.int64, sep="\n")
            scale = 10 ** (3 - decimals)
            if (
                len(out) == len(values)  # a value holding a newline would add a line
                and out.max() < _INT64.max // scale
                and out.min() > _INT64.min // scale
            ):
                return out * scale
    return np.array(
        [
            t * 1000 if t.__class__ is int else int(t[:-4] + t[-3:]) if t[-4:-3] == "." else us_text_to_ns(t)
            for t in values
        ],
        np.int64,
    )
