"""Step-level predictions: which micro-batch size and precision for a global batch, and what-if knobs.

A learner step over ``N`` tokens in micro-batches of ``n`` tokens costs::

    step(N, n) = (N / n) * per_microbatch_s + per_step_s + N * per_token_s

where ``per_microbatch_s`` is the fitted fixed cost, ``per_token_s`` the fitted slope and ``per_step_s`` the
phases that do not scale with ``n`` (generate, sync: medians from run directories, or ``--other-phase``).
Bigger micro-batches amortize the fixed cost, so the fastest allowed size is the largest that fits in
memory: ``peak_mem_bytes(n) = mem_fixed + mem_per_token * n <= cap`` (the memory line fitted per precision).

What-if knobs (``--what-if k=v``), applied to every non-baseline precision:

- ``fixed_scale=S``: the fixed cost the low precision *adds* over the baseline is multiplied by S
  (``fixed_low' = fixed_base + S * d_fixed``), so ``n*`` scales by S. The dashboard uses the same rule.
- ``weight_quant=per_step``: weights are quantized once per step instead of once per micro-batch. With ``q``
  the weight-quantization seconds per micro-batch, ``step = (N/n) * (fixed - q) + q + N * per_token``.
  ``q`` comes from, in order: ``weight_quant_s=SECONDS``; the ``quantize`` kernel class of a labelled ingest
  of that precision (its total quantize time per micro-batch: an upper bound, since it also holds activation
  and gradient casts); else the sweep's ``d_fixed`` (an upper bound: all added fixed cost taken as weight
  quantization). The estimate and its source are reported. With both knobs, ``q`` is scaled by S too (it is
part of the added fixed cost) and never exceeds the adjusted fixed cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

from perfmodel.model import LineFit
from tracing.outputs.errors import InputError

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
    precision: str
    per_microbatch_s: float
    per_token_s: float
    per_step_s: float = 0.0

    def seconds(self, global_tokens: float, n: float | np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=float)
        return (
            (global_tokens / n) * self.per_microbatch_s + self.per_step_s + global_tokens * self.per_token_s
        )


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
) -> tuple[float, str]:
    """Seconds of weight quantization per micro-batch for ``low`` and where the number comes from."""
    if knobs.weight_quant_s is not None:
        q, source = knobs.weight_quant_s, "given with --what-if weight_quant_s"
    elif (
        kernels is not None
        and "kernel_class" in kernels.columns
        and (kernel_microbatches or {}).get(low.precision)
        and ((kernels["precision"] == low.precision) & (kernels["kernel_class"] == "quantize")).any()
    ):
        sel = kernels[(kernels["precision"] == low.precision) & (kernels["kernel_class"] == "quantize")]
        q = float(sel["total_ns"].sum()) * 1e-9 / kernel_microbatches[low.precision]
        source = "quantize kernel class of the labelled trace per micro-batch (upper bound: includes activation casts)"
    else:
        q = max(low.fixed_s - base.fixed_s, 0.0)
        source = "sweep d_fixed (upper bound: all added fixed cost taken as weight quantization)"
    return float(min(max(q, 0.0), max(low.fixed_s, 0.0))), source


def step_costs(
    fits: Mapping[str, Line],
    baseline: str,
    other_phases_s: Mapping[str, float] | None = None,
    knobs: WhatIf | None = None,
    weight_quant_s: Mapping[str, float] | None = None,
) -> dict[str, StepCost]:
    """One StepCost per precision (the baseline is never changed by knobs)."""
    knobs = knobs or WhatIf()
    other = float(sum((other_phases_s or {}).values()))
    base = fits[baseline]
    out = {}
    for prec, f in fits.items():
        fixed, per_step = f.fixed_s, other
        if prec != baseline:
            fixed = base.fixed_s + knobs.fixed_scale * (f.fixed_s - base.fixed_s)
            if knobs.weight_quant == "per_step":
                q = min(knobs.fixed_scale * (weight_quant_s or {}).get(prec, 0.0), max(fixed, 0.0))
                fixed, per_step = fixed - q, per_step + q
        out[prec] = StepCost(prec, fixed, f.per_token_s, per_step)
    return out


def step_breakeven(base: StepCost, low: StepCost, global_tokens: float) -> float | None:
    """Micro-batch size where the two step times are equal (None when they never cross at n > 0)."""
    d_mb = low.per_microbatch_s - base.per_microbatch_s
    d_rest = (low.per_step_s - base.per_step_s) / global_tokens + (low.per_token_s - base.per_token_s)
    if d_rest == 0:
        return None
    n = -d_mb / d_rest
    return float(n) if n > 0 else None


def max_tokens_under_cap(memory: LineFit | None, cap_bytes: float | None) -> float | None:
    """Largest n with predicted peak memory <= cap (None: no cap, no memory data, or memory not growing)."""
    if cap_bytes is None or memory is None or memory.slope <= 0:
        return None
    return float((cap_bytes - memory.intercept) / memory.slope)


def default_global_tokens(mb: pd.DataFrame) -> int:
    """Tokens per learner step in the data: median over steps of the summed ``num_tokens`` (sweeps keep it
    constant); the largest size when steps are not recorded."""
    if (mb["step"] == 0).all() and (mb["microbatch"] == 0).all():
        return int(mb["tokens_per_microbatch"].max())
    cols = ["model", "phase", "precision", "tokens_per_microbatch", "repeat", "step"]
    per_step = mb.groupby(cols, sort=False)["num_tokens"].sum()
    if per_step.nunique() > 1 or per_step.max() > mb["tokens_per_microbatch"].max():
        return int(per_step.median())
    return int(mb["tokens_per_microbatch"].max())


def recommend(
    costs: Mapping[str, StepCost],
    memory: Mapping[str, LineFit | None],
    global_tokens: float,
    sizes: list[int],
    cap_bytes: float | None = None,
) -> dict[str, object]:
    """Fastest (precision, micro-batch size) for ``global_tokens`` under the memory cap.

    Candidates: the measured sizes up to ``global_tokens``, plus the largest size that fits the cap and
    ``global_tokens`` itself when allowed. Sizes above the measured range are marked ``extrapolated``.
    """
    per_precision = {}
    for prec, cost in costs.items():
        n_cap = max_tokens_under_cap(memory.get(prec), cap_bytes)
        limit = min(global_tokens, n_cap) if n_cap is not None else global_tokens
        cands = {float(s) for s in sizes if s <= limit} | {float(np.floor(limit))}
        cands = {c for c in cands if c >= 1}
        if not cands:
            per_precision[prec] = {
                "tokens_per_microbatch": None,
                "step_seconds": None,
                "reason": f"memory cap allows {n_cap:.0f} tokens per micro-batch",
            }
            continue
        best = min(cands, key=lambda n: float(cost.seconds(global_tokens, n)))
        per_precision[prec] = {
            "tokens_per_microbatch": int(best),
            "step_seconds": float(cost.seconds(global_tokens, best)),
            "memory_limit_tokens": n_cap,
            "extrapolated": bool(best > max(sizes)),
        }
    ok = {p: v for p, v in per_precision.items() if v["step_seconds"] is not None}
    if not ok:
        return {
            "precision": None,
            "tokens_per_microbatch": None,
            "per_precision": per_precision,
            "reason": "no precision fits under the memory cap",
        }
    best_prec = min(ok, key=lambda p: ok[p]["step_seconds"])
    return {
        "global_batch_tokens": int(global_tokens),
        "mem_cap_bytes": cap_bytes,
        "precision": best_prec,
        "tokens_per_microbatch": ok[best_prec]["tokens_per_microbatch"],
        "step_seconds": ok[best_prec]["step_seconds"],
        "per_precision": per_precision,
    }
