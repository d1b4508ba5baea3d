"""Range attribution with retirement (tracing.analysis.range_ops) against the all-at-once function
(attribution._attribute): random nested and overlapping ranges on several processes and threads, ops launched
before, inside and after them (some starting before their launch, some without one), fed in (start, row) order a
few at a time, ranges admitted a few at a time; every range's counters equal, whatever the slab and part sizes,
and most ranges retired before the end."""

from __future__ import annotations

import numpy as np
import pytest

from tracing.analysis import attribution, range_ops
from tracing.analysis.opwindows import cut_between_starts
from tracing.outputs import schema


def _ranges(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    pid = rng.integers(1, 3, n)
    tid = rng.integers(10, 13, n)
    start = np.sort(rng.integers(0, 200_000, n))
    dur = np.where(rng.random(n) < 0.05, rng.integers(0, 100_000, n), rng.integers(0, 2_000, n))
    end = start + dur
    order = np.lexsort((-end, start))  # table order
    return {"pid": pid[order], "tid": tid[order], "start_ns": start[order], "end_ns": end[order]}


def _ops(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    ls = rng.integers(0, 210_000, n)
    lag = np.where(rng.random(n) < 0.1, -rng.integers(0, 50, n), rng.integers(0, 3_000, n))
    start = ls + lag
    ls = np.where(rng.random(n) < 0.1, schema.NO_ID, ls)  # no launch record
    ops = {
        "start_ns": start,
        "end_ns": start + rng.integers(1, 500, n),
        "launch_start_ns": ls,
        "pid": rng.integers(1, 3, n),
        "launch_tid": rng.integers(10, 13, n),
        "rid": np.arange(n),
    }
    order = np.lexsort((ops["rid"], ops["start_ns"]))
    return {k: v[order] for k, v in ops.items()}


def _chunks(ops: dict[str, np.ndarray], size: int):
    n = len(ops["start_ns"])
    return cut_between_starts({k: v[a : a + size] for k, v in ops.items()} for a in range(0, n, size))


@pytest.mark.parametrize(("slab", "chunk", "part"), [(3, 7, 5), (64, 50, 1000), (1 << 16, 1 << 20, 17)])
@pytest.mark.parametrize("seed", [0, 1])
def test_retired_counters_equal_all_at_once(slab, chunk, part, seed, tmp_path):
    rng = np.random.default_rng(seed)
    ranges, ops = _ranges(rng, 600), _ops(rng, 3_000)
    acc = range_ops.RangeOps(range_ops.held_slabs(ranges, slab), tmp_path)
    launched = ops["launch_start_ns"] != schema.NO_ID
    acc.set_lag(int((ops["start_ns"] - ops["launch_start_ns"])[launched].max()))
    for c in _chunks(ops, chunk):
        acc.add(c)
    held = acc.most_live
    counters = acc.finish()
    for prefix, op_keys, range_keys in attribution.RULES:
        launch = {
            "pid": ops["pid"],
            "launch_tid": ops["launch_tid"],
            "launch_start_ns": ops["launch_start_ns"],
        }
        launch |= {"start_ns": ops["start_ns"], "end_ns": ops["end_ns"]}
        want = attribution._attribute(
            [ranges[k] for k in range_keys], ranges["start_ns"], ranges["end_ns"], launch, list(op_keys)
        )
        got = [np.concatenate(x) for x in zip(*(p[prefix] for _, p in counters.parts(part)), strict=True)]
        for w, g, f in zip(want, got, ("ops", "busy", "first", "last"), strict=True):
            assert np.array_equal(w, g), (prefix, f)
        assert want[0].sum() > 1_000  # ranges do get ops under both rules
    ends = np.concatenate([e for _, e in attribution._window_ends(attribution._Held(ranges), counters)])
    assert np.array_equal(ends, attribution._window_end(ranges["end_ns"], want))
    assert [a for a, _ in counters.parts(part)] == list(range(0, 600, part))
    if slab < 600:
        assert held < 300  # most ranges were retired before the last ones came in
    counters.close()
    assert not list(tmp_path.iterdir())


def test_without_a_lag_nothing_retires_and_no_ranges_give_no_parts(tmp_path):
    rng = np.random.default_rng(3)
    ranges, ops = _ranges(rng, 100), _ops(rng, 500)
    acc = range_ops.RangeOps(range_ops.held_slabs(ranges, 4), tmp_path)
    for c in _chunks(ops, 9):
        acc.add(c)
    assert acc.most_live == 100  # every slab admitted, none retired
    acc.finish().close()
    acc = range_ops.RangeOps(
        range_ops.held_slabs(ranges, 4), tmp_path
    )  # no op at all: finish admits a slab at a time
    counters = acc.finish()
    assert 0 < acc.most_live <= 4 + 10  # a slab (and ties) plus the long ranges
    parts = [p for _, p in counters.parts(7)]
    assert sum(len(p["window"][0]) for p in parts) == 100
    assert all(not p[r][0].any() for p in parts for r in p)  # no range has an op
    counters.close()
    empty = {k: np.zeros(0, np.int64) for k in ("pid", "tid", "start_ns", "end_ns")}
    acc = range_ops.RangeOps(range_ops.held_slabs(empty), tmp_path)
    acc.set_lag(0)
    for c in _chunks(ops, 9):
        acc.add(c)
    counters = acc.finish()
    assert list(counters.parts(10)) == []
    assert list(attribution._window_ends(attribution._Held(empty), counters)) == []
    counters.close()
    assert not list(tmp_path.iterdir())
