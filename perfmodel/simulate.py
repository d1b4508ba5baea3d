"""Synthetic micro-batch sweeps with known truth, for tests, benchmarks and the coverage study.

Noise model (what real sweeps show): each (precision, size, repeat) gets a multiplicative repeat effect
(``repeat_noise``: clock, cache, co-tenants drift between repeats) and each micro-batch its own
multiplicative jitter (``noise``). Micro-batches of one repeat therefore share noise, as they do on hardware:
the reason the fits use repeat means as independent points. ``shared_drift`` adds a log-normal factor per
(size, repeat) common to every precision: the machine drifting while precisions run back to back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from tracing.outputs.schema import MICROBATCH_COLUMNS

DEFAULT_SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)
# (fixed_s, per_token_s, stall_fixed_s): MXFP8 adds 9 ms fixed, saves 2 us/token -> n* = 4500 tokens.
PAPER_LIKE = {"bf16": (0.010, 4e-6, 0.002), "mxfp8": (0.019, 2e-6, 0.009)}


def simulate_sweep(
    truth: Mapping[str, tuple[float, float, float]] = PAPER_LIKE,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 4,
    microbatches: int = 3,
    noise: float = 0.03,
    repeat_noise: float = 0.015,
    shared_drift: float = 0.0,
    stall_per_token_s: float = 1e-7,
    model: str = "sim",
    phase: str = "update",
    rng: np.random.Generator | None = None,
) -> pd.DataFrame:
    """A micro-batch table (``MICROBATCH_COLUMNS``) from known (fixed_s, per_token_s, stall_fixed_s)."""
    rng = rng or np.random.default_rng(0)
    # Drift of the machine, common to all precisions of a (size, repeat) cell (they run back to back).
    drift = 1.0
    if shared_drift > 0:
        drift = np.repeat(np.exp(rng.normal(0.0, shared_drift, len(sizes) * repeats)), microbatches)
    parts = []
    for prec, (fixed, per_token, stall) in truth.items():
        n = np.repeat(np.asarray(sizes, dtype=np.int64), repeats * microbatches)
        rep = np.tile(np.repeat(np.arange(repeats), microbatches), len(sizes))
        mbi = np.tile(np.arange(microbatches), len(sizes) * repeats)
        rep_eff = np.repeat(1.0 + rng.normal(0.0, repeat_noise, len(sizes) * repeats), microbatches)
        mu = (fixed + per_token * n) * drift
        secs = mu * rep_eff * (1.0 + rng.normal(0.0, noise, len(n)))
        stall_s = (stall + stall_per_token_s * n) * rep_eff * (1.0 + rng.normal(0.0, noise, len(n)))
        parts.append(
            pd.DataFrame(
                {
                    "model": model,
                    "precision": prec,
                    "phase": phase,
                    "tokens_per_microbatch": n,
                    "num_tokens": n,
                    "repeat": rep,
                    "step": rep,
                    "microbatch": mbi,
                    "seconds": np.maximum(secs, 0.0),
                    "gpu_busy_seconds": np.maximum(secs - stall_s, 0.0),
                    "host_stall_seconds": np.maximum(stall_s, 0.0),
                    "peak_mem_bytes": 5e7 + 4096.0 * n,
                    "flops": np.nan,
                    "source": "sweep",
                }
            )
        )
    return pd.concat(parts, ignore_index=True).astype(dict(MICROBATCH_COLUMNS))
