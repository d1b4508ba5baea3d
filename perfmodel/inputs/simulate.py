"""Synthetic micro-batch tables with known truth, for tests, benchmarks and the coverage study.

Every case the cost model must get right has a knob: a clean line, a host/GPU knee (``host_fixed_s``: the
host needs that long to launch a micro-batch, so wall = max(host, GPU)), a per-step cost on micro-batch 0
(``per_step_s``), attention's quadratic cost (``per_sq_token_s`` with varying sequence lengths), two global
batch sizes and dynamic batching (micro-batches of one step of different lengths).

Noise model (what real sweeps show): each step gets a multiplicative effect (``repeat_noise``: clock, cache and
co-tenants drift between steps) and each micro-batch its own multiplicative jitter (``noise``). Micro-batches
of one step therefore share noise, as they do on hardware: the reason the fits resample whole steps.
``shared_drift`` adds a log-normal factor per (size, repeat) common to every precision: the machine drifting
while precisions run back to back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracing.outputs.schema import MICROBATCH_COLUMNS

DEFAULT_SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class Truth:
    """One precision's true costs. GPU-side time of a micro-batch of ``n`` tokens (sequence lengths ``L_j``)::

        gpu(n) = fixed_s + per_token_s * n + per_sq_token_s * sum_j L_j^2   (+ per_step_s on micro-batch 0)
        wall   = max(host(n), gpu(n)),  host(n) = host_fixed_s + host_per_token_s * n   (no host: wall = gpu)

    Host stall is ``stall_fixed_s + stall_per_token_s * n`` plus, when host-bound, ``host(n) - gpu(n)``;
    GPU busy is wall minus stall.
    """

    fixed_s: float
    per_token_s: float
    stall_fixed_s: float = 0.0
    host_fixed_s: float | None = None
    host_per_token_s: float = 0.0
    per_step_s: float = 0.0
    per_sq_token_s: float = 0.0

    def wall_s(self, n: float | np.ndarray, sum_sq_tokens: float | np.ndarray = 0.0) -> np.ndarray:
        """Mean wall seconds of a micro-batch that is not the first of its step."""
        n = np.asarray(n, dtype=float)
        gpu = self.fixed_s + self.per_token_s * n + self.per_sq_token_s * np.asarray(sum_sq_tokens, float)
        if self.host_fixed_s is None:
            return gpu
        return np.maximum(self.host_fixed_s + self.host_per_token_s * n, gpu)


# (fixed_s, per_token_s, stall_fixed_s): MXFP8 adds 9 ms fixed, saves 2 us/token -> n* = 4500 tokens.
PAPER_LIKE = {"bf16": (0.010, 4e-6, 0.002), "mxfp8": (0.019, 2e-6, 0.009)}
# Launch-bound small micro-batches, GPU-bound large ones: bf16 turns GPU-bound at 2,000 tokens, mxfp8 (more,
# smaller kernels to launch) at 8,000; the wall times cross at 4,250 tokens.
KNEE = {
    "bf16": Truth(0.002, 4e-6, stall_fixed_s=0.0005, host_fixed_s=0.010),
    "mxfp8": Truth(0.003, 2e-6, stall_fixed_s=0.0005, host_fixed_s=0.019),
}


def as_truth(t: Truth | Sequence[float]) -> Truth:
    return t if isinstance(t, Truth) else Truth(*t)


def true_crossings(base: Truth, low: Truth, hi_tokens: float = 1e7) -> list[float]:
    """Micro-batch sizes (tokens) where the two true wall times cross (a fine grid, then linear interpolation)."""
    ns = np.geomspace(1.0, hi_tokens, 200_001)
    d = low.wall_s(ns) - base.wall_s(ns)
    idx = np.flatnonzero(np.sign(d[:-1]) * np.sign(d[1:]) < 0)
    return [float(ns[i] - d[i] * (ns[i + 1] - ns[i]) / (d[i + 1] - d[i])) for i in idx]


def _seq_lens(n: int, seq_len: int, spread: float, rng: np.random.Generator) -> list[int]:
    """Sequence lengths packing ``n`` tokens: log-normal around ``seq_len`` (``spread`` its log sd)."""
    out: list[int] = []
    left = n
    while left > 0:
        length = int(max(1, round(seq_len * np.exp(rng.normal(0.0, spread))))) if spread > 0 else seq_len
        length = min(length, left)
        out.append(length)
        left -= length
    return out


def simulate_sweep(
    truth: Mapping[str, Truth | Sequence[float]] = PAPER_LIKE,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 4,
    microbatches: int = 3,
    global_tokens: int | Sequence[int] | None = None,
    noise: float = 0.03,
    repeat_noise: float = 0.015,
    shared_drift: float = 0.0,
    stall_per_token_s: float = 1e-7,
    seq_len: int | None = None,
    seq_len_spread: float = 0.0,
    dynamic: bool = False,
    per_step_on: str = "first",
    model: str = "sim",
    phase: str = "update",
    rng: np.random.Generator | None = None,
) -> pd.DataFrame:
    """A micro-batch table (``MICROBATCH_COLUMNS`` plus ``global_tokens`` / ``seq_lens`` when simulated).

    One step per (global batch, size, repeat, precision), with ``microbatches`` micro-batches, or
    ``global_tokens // size`` of them when ``global_tokens`` is given (one or several global batches).
    ``seq_len``: pack sequences of about that length (``seq_len_spread``: log sd) and record ``seq_lens``.
    ``dynamic``: each micro-batch holds a random 40-100 % of its size's token budget (dynamic batching).
    ``per_step_on``: the micro-batch that pays ``per_step_s``: ``first`` (a weight cast cached across
    micro-batches) or ``last`` (e.g. an optimizer step inside the last micro-batch's window).
    """
    if per_step_on not in ("first", "last"):
        raise ValueError(f"per_step_on must be 'first' or 'last', got {per_step_on!r}")
    rng = rng or np.random.default_rng(0)
    truths = {p: as_truth(t) for p, t in truth.items()}
    globals_ = [None] if global_tokens is None else list(np.atleast_1d(global_tokens).astype(int))
    drift = {
        (g, n, r): float(np.exp(rng.normal(0.0, shared_drift))) if shared_drift > 0 else 1.0
        for g in globals_
        for n in sizes
        for r in range(repeats)
    }
    rows: list[dict] = []
    step = 0
    for prec, t in truths.items():
        for g in globals_:
            for n in sizes:
                k = microbatches if g is None else max(1, int(g) // int(n))
                for r in range(repeats):
                    step_eff = drift[(g, n, r)] * (1.0 + rng.normal(0.0, repeat_noise))
                    for m in range(k):
                        tokens = round(float(n) * rng.uniform(0.4, 1.0)) if dynamic else int(n)
                        lens = _seq_lens(tokens, seq_len, seq_len_spread, rng) if seq_len else None
                        pays = m == (0 if per_step_on == "first" else k - 1)
                        measured = _measure(t, tokens, lens, pays, step_eff, noise, stall_per_token_s, rng)
                        rows.append(
                            {
                                "precision": prec,
                                "tokens_per_microbatch": int(n),
                                "num_tokens": tokens,
                                "repeat": r,
                                "step": step,
                                "microbatch": m,
                                "rank": 0,
                                "global_tokens": g,
                                "seq_lens": lens,
                                "peak_mem_bytes": 5e7 + 4096.0 * tokens,
                                "flops": np.nan,
                                **measured,
                            }
                        )
                    step += 1
    df = pd.DataFrame(rows)
    df["model"], df["phase"], df["source"] = model, phase, "sweep"
    extra = [c for c in ("global_tokens", "seq_lens") if df[c].notna().any()]
    return df.astype(dict(MICROBATCH_COLUMNS))[list(MICROBATCH_COLUMNS) + extra]


def _measure(
    t: Truth,
    n: int,
    lens: list[int] | None,
    pays_per_step: bool,
    step_eff: float,
    noise: float,
    stall_per_token_s: float,
    rng: np.random.Generator,
) -> dict[str, float]:
    """Wall, GPU busy and host stall seconds of one micro-batch (see ``Truth``)."""
    sq = float(np.sum(np.square(lens))) if lens else 0.0
    gpu = t.fixed_s + t.per_token_s * n + t.per_sq_token_s * sq + (t.per_step_s if pays_per_step else 0.0)
    host = None if t.host_fixed_s is None else t.host_fixed_s + t.host_per_token_s * n
    wall = (gpu if host is None else max(host, gpu)) * step_eff * (1.0 + rng.normal(0.0, noise))
    stall = t.stall_fixed_s + stall_per_token_s * n + (0.0 if host is None else max(0.0, host - gpu))
    stall = min(max(stall * step_eff * (1.0 + rng.normal(0.0, noise)), 0.0), max(wall, 0.0))
    return {
        "seconds": max(wall, 0.0),
        "gpu_busy_seconds": max(wall, 0.0) - stall,
        "host_stall_seconds": stall,
    }
