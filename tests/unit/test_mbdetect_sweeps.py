"""Micro-batch detection's per-burst and per-forward steps, done by sorting and searching rather than one pass over
every item per burst (quadratic in a whole process without ranges: thousands of micro-batches), give what the
direct definitions give, on random processes."""

from __future__ import annotations

import numpy as np
import pytest

from tracing.analysis import mbdetect
from tracing.analysis.mbregions import Region
from tracing.analysis.mbsignals import make_process, name_signals

NAMES = ["aten::mm", "MmBackward0", "aten::embedding", "cudaLaunchKernel", "aten::add"]


def _process(rng: np.random.Generator, n_host: int, n_launch: int):
    start = np.sort(rng.integers(0, 1_000_000, n_host))
    host = {
        "tid": rng.choice([1, 2, 3], n_host),
        "start": start,
        "end": start + rng.integers(1, 5_000, n_host),
        "code": rng.integers(0, len(NAMES), n_host),
        "shape": np.zeros(n_host, np.int64),
        "is_call": np.zeros(n_host, np.int64),
    }
    l_start = np.sort(rng.integers(0, 1_000_000, n_launch))
    launches = {
        "l_tid": rng.choice([1, 2], n_launch),
        "l_start": l_start,
        "l_end": l_start + rng.integers(1, 300, n_launch),
        "op_start": l_start + 500,
        "op_end": l_start + 1_000,
        "prev_end": np.r_[-1, l_start[:-1] + 1_000],
        "l_kernel": np.ones(n_launch, bool),
        "l_gemm": rng.random(n_launch) < 0.3,
    }
    empty = np.zeros(0, np.int64)
    return make_process(7, host, launches, empty, empty)


def _bursts_by_definition(sig, p, f_tid, interrupts):
    """The definition: per interval between interrupts, the autograd threads' items' first start and last end."""
    autograd = set(np.unique(p.tid[sig.is_autograd[p.code] & (p.tid != f_tid)]).tolist())
    b_l, b_h = np.isin(p.l_tid, list(autograd)), np.isin(p.tid, list(autograd))
    starts = np.concatenate([p.l_start[b_l], p.start[b_h]])
    ends = np.concatenate([p.l_end[b_l], p.end[b_h]])
    key = np.searchsorted(interrupts, starts, side="right")
    return sorted((int(starts[key == k].min()), int(ends[key == k].max())) for k in np.unique(key).tolist())


@pytest.mark.parametrize("coarse", [1, 10_007])  # coarse clocks: launches, lookups and items at equal times
@pytest.mark.parametrize("block", [97, 1 << 16])  # an interval's items split across blocks, or one block
@pytest.mark.parametrize("seed", range(6))
def test_bursts_are_the_autograd_work_between_two_interrupts(seed, block, coarse, monkeypatch):
    """Interrupts: F's launches (counted as the launches are read, never held) and its embedding lookups."""
    monkeypatch.setattr(mbdetect, "_BLOCK", block)
    rng = np.random.default_rng(seed)
    sig = name_signals(NAMES, [""])
    p = _process(rng, 3_000, 800)
    for c in ("start", "end", "l_start", "l_end"):
        setattr(p, c, getattr(p, c) // coarse * coarse)
    f_tid = 1
    p.l_tid = np.where(rng.random(len(p.l_tid)) < 0.5 / (1 + seed), f_tid, 2)  # many bursts to few
    anchors = np.sort(rng.choice(p.start, 3 + seed))  # at host items' own times
    interrupts = np.sort(np.concatenate([p.l_start[p.l_tid == f_tid], anchors]))
    region = Region(p.pid, f_tid, None, 0, 2_000_000, -1, "")
    autograd = sorted(set(np.unique(p.tid[sig.is_autograd[p.code] & (p.tid != f_tid)]).tolist()))
    got = mbdetect._bursts(sig, p, region, f_tid, anchors, autograd)
    assert got == _bursts_by_definition(sig, p, f_tid, interrupts)
    assert len(got) > 1


@pytest.mark.parametrize("block", [97, 1 << 16])
@pytest.mark.parametrize("seed", range(4))
def test_last_gemm_before_each_query_is_the_latest_earlier_gemm_of_f(seed, block, monkeypatch):
    monkeypatch.setattr(mbdetect, "_BLOCK", block)
    rng = np.random.default_rng(seed)
    sig = name_signals(NAMES, [""])
    p = _process(rng, 3_000, 800)
    f_tid = 1
    gemm = np.sort(
        np.concatenate(
            [
                p.start[(p.tid == f_tid) & (sig.gemm_arg[p.code] >= 0)],
                p.l_start[(p.l_tid == f_tid) & p.l_gemm],
            ]
        )
    )
    queries = np.sort(
        np.concatenate([rng.choice(gemm, 10), rng.integers(-5, 1_100_000, 40)])
    )  # ties: not before
    region = Region(p.pid, f_tid, None, 0, 2_000_000, -1, "")
    got = mbdetect._last_gemm_before(sig, p, region, f_tid, queries)
    want = [
        int(gemm[gemm < q].max()) if (gemm < q).any() else np.iinfo(np.int64).min for q in queries.tolist()
    ]
    assert got.tolist() == want


@pytest.mark.parametrize("seed", range(6))
def test_forward_groups_split_where_a_gemm_or_a_backward_starts_between_two_lookups(seed):
    rng = np.random.default_rng(seed)
    anchors = np.sort(rng.integers(0, 100_000, 200))
    # some at a lookup's own time: strictly between two lookups is what splits
    gemms = np.sort(np.concatenate([rng.integers(0, 100_000, 20 * seed), rng.choice(anchors, 5)]))
    b_starts = np.sort(np.concatenate([rng.integers(0, 100_000, 30), rng.choice(anchors, 10)]))
    bursts = [(int(b), int(b) + 10) for b in b_starts]
    want: list[list[int]] = [[0]]
    for j in range(1, len(anchors)):
        lo, hi = anchors[j - 1], anchors[j]
        split = ((gemms > lo) & (gemms < hi)).any() or ((b_starts > lo) & (b_starts < hi)).any()
        want.append([j]) if split else want[-1].append(j)
    before = [int(gemms[gemms < a].max()) if (gemms < a).any() else np.iinfo(np.int64).min for a in anchors]
    assert mbdetect._forward_groups(anchors, np.array(before, np.int64), bursts) == want
