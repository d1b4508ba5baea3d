"""Step-level predictions: which micro-batch size and precision for a global batch, and what-if knobs.

A learner step over ``N`` tokens in micro-batches of ``n`` tokens costs::

    step(N, n) = (N / n) * mb(n) + per_step_s,    mb(n) = per_microbatch_s + per_token_s * n  (a line)

or ``mb(n)`` the fitted knee curve (:class:`perfmodel.fitting.model.Curve`) when the data chose one. ``per_step_s``
is the fitted cost paid once per step (micro-batch 0 / two global batch sizes) plus the phases that do not
scale with ``n`` (generate, sync: each precision's own, from its run directories or ``--phase P:X=S``; or
``--other-phase``, the same for every precision). The whole step over several phases: :mod:`perfmodel.step.model`. Bigger micro-batches
amortize the fixed cost, so the fastest allowed size is the largest that fits in memory: ``peak_mem_bytes(n)
= mem_fixed + mem_per_token * n <= cap`` (the memory line fitted per precision).

What-if knobs (``--what-if k=v``) act on the term that holds the cost, for every non-baseline precision:

- ``fixed_scale=S``: the cost the low precision *adds* over the baseline -- per micro-batch (``d_fixed``)
  and per step (``d_per_step``) -- is multiplied by S (``fixed_low' = fixed_base + S * d_fixed``), so ``n*``
  scales by S. The dashboard uses the same rule.
- ``weight_quant=per_step``: weights are quantized once per step instead of once per micro-batch: ``q``
  seconds move from the per-micro-batch term to the per-step term. ``q`` comes from, in order:
  ``weight_quant_s=SECONDS``; when the fit already finds the low precision's added per-step cost (weights
  cast once per step already, as Transformer Engine does with ``is_first_microbatch``), 0 -- there is nothing
  left to move; the ``quantize`` kernel class of a labelled ingest of that precision (an upper bound, since it
  also holds activation and gradient casts); the physical weight-cast floor (weight bytes at the device's
  HBM bandwidth, :mod:`perfmodel.kernels.bounds`, with ``--device`` and ``--model-shape``), at most ``d_fixed``; else
  the upper end of the range 0 to ``d_fixed`` (said so; :mod:`perfmodel.step.whatifs` gives both ends with
  intervals). The estimate and its source are reported. With both knobs, ``q`` is
  scaled by S too and never exceeds the adjusted fixed cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from perfmodel.breakeven.curves import crossing_roots, pick_root
from perfmodel.fitting.model import Curve
from tracing.outputs.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

KNOBS = ("fixed_scale", "weight_quant", "weight_quant_s")


class Line(Protocol):
    """Anything with a fitted line: ``PrecisionFit``, or the dashboard's view of a fits.json entry."""

    @property
    def precision(self) -> str: ...
    @property
    def fixed_s(self) -> float: ...
    @property
    def per_token_s(self) -> float: ...


@dataclass(frozen=True)
class StepCost:
    """One precision's step cost. ``curve`` (a knee model), when set, replaces ``per_microbatch_s +
    per_token_s * n``, shifted down by ``moved_s`` (per-micro-batch cost a what-if moved or removed)."""

    precision: str
    per_microbatch_s: float
    per_token_s: float
    per_step_s: float = 0.0
    curve: Curve | None = None
    moved_s: float = 0.0

    def microbatch_seconds(self, n: float | np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=float)
        if self.curve is not None:
            return self.curve(n) - self.moved_s
        return self.per_microbatch_s + self.per_token_s * n

    def seconds(self, global_tokens: float, n: float | np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=float)
        return (global_tokens / n) * self.microbatch_seconds(n) + self.per_step_s

    def as_curve(self) -> Curve:
        """The per-micro-batch cost as a curve (a line unless a knee model was fitted)."""
        if self.curve is None:
            return Curve.line(self.per_microbatch_s, self.per_token_s)
        c = self.curve
        return Curve(c.knee, c.a1 - self.moved_s, c.b1, c.a2 - self.moved_s, c.b2)


@dataclass(frozen=True)
class WhatIf:
    fixed_scale: float = 1.0
    weight_quant: str = "per_microbatch"
    weight_quant_s: float | None = None

    def __post_init__(self) -> None:
        if not (self.fixed_scale >= 0):
            raise InputError(f"--what-if fixed_scale must be >= 0, got {self.fixed_scale}")
        if self.weight_quant not in ("per_microbatch", "per_step"):
            raise InputError("--what-if weight_quant must be per_microbatch or per_step")
        if self.weight_quant_s is not None and self.weight_quant_s < 0:
            raise InputError("--what-if weight_quant_s must be >= 0")

    @property
    def active(self) -> bool:
        return self.fixed_scale != 1.0 or self.weight_quant == "per_step"


def parse_what_if(items: list[str] | None) -> WhatIf:
    """``["fixed_scale=0.5", "weight_quant=per_step"]`` -> WhatIf; unknown keys or values raise InputError."""
    kw: dict[str, object] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in KNOBS:
            raise InputError(f"--what-if {item!r}: expected one of {', '.join(k + '=...' for k in KNOBS)}")
        if key == "weight_quant":
            kw[key] = value.strip()
        else:
            try:
                kw[key] = float(value)
            except ValueError:
                raise InputError(f"--what-if {item!r}: {key} needs a number") from None
    return WhatIf(**kw)  # type: ignore[arg-type]


def weight_quant_seconds(
    base: Line,
    low: Line,
    knobs: WhatIf,
    kernels: pd.DataFrame | None = None,
    kernel_microbatches: Mapping[str, int] | None = None,
    floor_s: float | None = None,
    floor_source: str | None = None,
) -> tuple[float, str]:
    """Seconds of weight quantization per micro-batch for ``low`` and where the number comes from."""
    d_step = float(getattr(low, "per_step_s", 0.0) or 0.0) - float(getattr(base, "per_step_s", 0.0) or 0.0)
    if knobs.weight_quant_s is not None:
        q, source = knobs.weight_quant_s, "given with --what-if weight_quant_s"
    elif getattr(low, "per_step_significant", False) and d_step > 0:
        q = 0.0
        source = (
            f"the fit already finds {d_step * 1e3:.3g} ms more per step than the baseline (micro-batch 0): "
            "weights are cast once per step already; nothing left to move"
        )
    elif (
        kernels is not None
        and "kernel_class" in kernels.columns
        and (kernel_microbatches or {}).get(low.precision)
        and ((kernels["precision"] == low.precision) & (kernels["kernel_class"] == "quantize")).any()
    ):
        sel = kernels[(kernels["precision"] == low.precision) & (kernels["kernel_class"] == "quantize")]
        q = float(sel["total_ns"].sum()) * 1e-9 / kernel_microbatches[low.precision]
        source = "quantize kernel class of the labelled trace per micro-batch (upper bound: includes activation casts)"
    elif floor_s is not None:
        q = min(float(floor_s), max(low.fixed_s - base.fixed_s, 0.0))
        source = (
            f"weight-cast floor ({floor_source or 'weight bytes at the device bandwidth'}), at most d_fixed"
        )
    else:
        q = max(low.fixed_s - base.fixed_s, 0.0)
        source = (
            "the upper end of the range 0 to d_fixed (device or model unknown: --device and --model-shape give "
            "the physical cast floor; step_model[].what_ifs has both ends with intervals)"
        )
    return float(min(max(q, 0.0), max(low.fixed_s, 0.0))), source


def step_costs(
    fits: Mapping[str, Line],
    baseline: str,
    other_phases_s: Mapping[str, float] | None = None,
    knobs: WhatIf | None = None,
    weight_quant_s: Mapping[str, float] | None = None,
    curves: Mapping[str, Curve] | None = None,
    other_by_precision: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, StepCost]:
    """One StepCost per precision (the baseline is never changed by knobs). A fit's ``per_step_s`` (when it
    has one) is part of its per-step cost; ``curves`` gives the knee model of a precision that has one.
    ``other_phases_s``: phases the same for every precision; ``other_by_precision``: each precision's own."""
    knobs = knobs or WhatIf()
    shared = float(sum((other_phases_s or {}).values()))
    own = {p: float(sum(v.values())) for p, v in (other_by_precision or {}).items()}
    curves = curves or {}
    base = fits[baseline]
    base_step = float(getattr(base, "per_step_s", 0.0) or 0.0)
    out = {}
    for prec, f in fits.items():
        fixed, step = f.fixed_s, float(getattr(f, "per_step_s", 0.0) or 0.0)
        moved = 0.0
        if prec != baseline:
            d_fixed = f.fixed_s - base.fixed_s
            fixed = base.fixed_s + knobs.fixed_scale * d_fixed
            moved = (1.0 - knobs.fixed_scale) * d_fixed
            step = base_step + knobs.fixed_scale * (step - base_step)
            if knobs.weight_quant == "per_step":
                q = min(knobs.fixed_scale * (weight_quant_s or {}).get(prec, 0.0), max(fixed, 0.0))
                fixed, step, moved = fixed - q, step + q, moved + q
        other = shared + own.get(prec, 0.0)
        out[prec] = StepCost(prec, fixed, f.per_token_s, step + other, curves.get(prec), moved)
    return out


def step_breakeven(base: StepCost, low: StepCost, global_tokens: float) -> float | None:
    """Micro-batch size where the two step times are equal for a global batch (None when they never cross
    at n > 0). With a knee curve: the last size where low becomes faster, else the first where it is slower."""
    d_step = low.per_step_s - base.per_step_s
    if base.curve is None and low.curve is None:
        d_mb = low.per_microbatch_s - base.per_microbatch_s
        d_rest = d_step / global_tokens + (low.per_token_s - base.per_token_s)
        if d_rest == 0:
            return None
        n = -d_mb / d_rest
        return float(n) if n >= 1 else None  # below one token: the step times do not cross
    roots, slopes = crossing_roots(low.as_curve().shifted(d_step / global_tokens), base.as_curve())
    for case in ("faster_above", "faster_below"):
        r = pick_root(roots, slopes, case)[0]
        if np.isfinite(r):
            return float(r)
    return None
