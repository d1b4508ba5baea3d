"""Vectorized bootstrap of straight-line fits: whole repeats resampled within each micro-batch size.

Why this resampling unit: micro-batches of one step share that step's noise (clock, cache and scheduler
state), so they are not independent draws; a *repeat* of a size is. Each bootstrap replicate keeps every size
of the grid (the design is fixed, as in a designed experiment) and draws, for each size, as many repeats as
were measured, with replacement. When some size has a single repeat (a CSV without a ``repeat`` column, a
single run per size) the unit falls back to single micro-batches within each size, and ``unit`` says so.

How it stays fast: a line fit needs only five sums per response (n, sum x, sum x^2, sum y, sum xy). They are
computed once per resampling cell; a replicate is then a weight vector over cells (how often each cell was
drawn), and all replicates together are one (B x cells) @ (cells x sums) product, done in chunks to bound
memory. With k repeats per size the plain bootstrap variance is (k-1)/k of the truth, so replicates are
expanded about the full-data fit by sqrt(k/(k-1)) (k = mean resampling cells per size). 100k micro-batches x 1000 replicates runs in well under a second when repeats are the unit
(``benchmarks/bench_fit.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

REPEAT_UNIT = "repeat within size"
ROW_UNIT = "micro-batch within size"
_MAX_CHUNK_ELEMENTS = 4_000_000


def resampling_cells(size_label: np.ndarray, repeat: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """(cell id per row, stratum (size index) per cell, unit name).

    Cells are (size, repeat) when every size has at least two repeats, else single rows.
    """
    size_label = np.asarray(size_label)
    repeat = np.asarray(repeat)
    sizes, size_idx = np.unique(size_label, return_inverse=True)
    pairs = np.stack([size_idx, repeat.astype(np.int64)], axis=1)
    uniq_pairs, cell_id = np.unique(pairs, axis=0, return_inverse=True)
    repeats_per_size = np.bincount(uniq_pairs[:, 0], minlength=len(sizes))
    if repeats_per_size.min() >= 2:
        return cell_id.ravel(), uniq_pairs[:, 0], REPEAT_UNIT
    order = np.argsort(size_idx, kind="stable")
    cell_id = np.empty(len(size_idx), dtype=np.int64)
    cell_id[order] = np.arange(len(size_idx))
    return cell_id, size_idx[order], ROW_UNIT


def _cell_sums(
    cell_id: np.ndarray, n_cells: int, xc: np.ndarray, y: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    w = mask.astype(float)
    yv = np.where(mask, y, 0.0)
    cols = (w, w * xc, w * xc * xc, yv, yv * xc)
    return np.stack([np.bincount(cell_id, weights=c, minlength=n_cells) for c in cols], axis=1)


def _draw_weights(
    rng: np.random.Generator, n_rep: int, offsets: np.ndarray, counts: np.ndarray
) -> np.ndarray:
    """(n_rep x cells) counts: for each stratum, ``counts[s]`` draws with replacement among its cells."""
    slot_offset = np.repeat(offsets, counts)
    slot_count = np.repeat(counts, counts)
    n_cells = len(slot_offset)
    idx = slot_offset + (rng.random((n_rep, n_cells)) * slot_count).astype(np.int64)
    flat = (np.arange(n_rep, dtype=np.int64)[:, None] * n_cells + idx).ravel()
    return np.bincount(flat, minlength=n_rep * n_cells).reshape(n_rep, n_cells).astype(float)


def bootstrap_lines(
    x: np.ndarray,
    ys: Sequence[np.ndarray],
    size_label: np.ndarray,
    repeat: np.ndarray,
    n_boot: int,
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], str]:
    """Bootstrap replicates of (intercept, slope) for each response in ``ys``, all from the same draws.

    A response may contain NaN (rows without that measurement); those rows are left out of that response's
    sums but the draws are shared, so replicates of different responses stay paired. Returns one (B, 2)
    array per response (NaN rows where a replicate cannot fit a line) and the resampling unit.
    """
    x = np.asarray(x, dtype=float)
    xm = float(x.mean())
    xc = x - xm
    cell_id, cell_stratum, unit = resampling_cells(size_label, repeat)
    order = np.argsort(cell_stratum, kind="stable")
    remap = np.empty_like(order)
    remap[order] = np.arange(len(order))
    cell_id = remap[cell_id]
    counts = np.bincount(cell_stratum)
    counts = counts[counts > 0]
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    n_cells = int(counts.sum())
    sums = np.concatenate(
        [_cell_sums(cell_id, n_cells, xc, np.asarray(y, dtype=float), np.isfinite(y)) for y in ys], axis=1
    )
    chunk = max(1, min(n_boot, _MAX_CHUNK_ELEMENTS // max(n_cells, 1)))
    out = np.empty((n_boot, sums.shape[1]))
    for start in range(0, n_boot, chunk):
        stop = min(n_boot, start + chunk)
        out[start:stop] = _draw_weights(rng, stop - start, offsets, counts) @ sums
    # The resampling variance of a mean of k draws is (k-1)/k of the sample's: with few repeats per size the
    # plain bootstrap is too narrow. Replicates are expanded about the full-data fit by sqrt(k/(k-1)).
    k = float(np.mean(counts))
    expand = np.sqrt(k / (k - 1.0)) if k > 1 else 1.0
    results = []
    for j in range(len(ys)):
        n, sx, sxx, sy, sxy = (out[:, 5 * j + k] for k in range(5))
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = (n * sxy - sx * sy) / (n * sxx - sx * sx)
            intercept = (sy - slope * sx) / n - slope * xm
        reps = np.stack([intercept, slope], axis=1)
        full = _full_fit(xc, np.asarray(ys[j], dtype=float), xm)
        results.append(full + expand * (reps - full))
    return results, unit


def _full_fit(xc: np.ndarray, y: np.ndarray, xm: float) -> np.ndarray:
    ok = np.isfinite(y)
    xo, yo = xc[ok], y[ok]
    d = xo - xo.mean()
    slope = float(d @ (yo - yo.mean()) / (d @ d))
    return np.array([yo.mean() - slope * xo.mean() - slope * xm, slope])


def percentile_ci(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of finite samples (NaN when there are none)."""
    s = samples[np.isfinite(samples)]
    if s.size == 0:
        return (float("nan"), float("nan"))
    lo, hi = np.quantile(s, [0.5 - level / 2.0, 0.5 + level / 2.0])
    return (float(lo), float(hi))
