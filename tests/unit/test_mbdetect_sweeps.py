"""Micro-batch detection's per-burst and per-forward steps, done by sorting and searching rather than one pass over
every item per burst (quadratic in a whole process without ranges: thousands of micro-batches), give what the
direct definitions give, on random processes."""

from __future__ import annotations

import numpy as np
import pytest

from tracing.analysis import mbdetect
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
        "op_end": l_start + 1_000,
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


@pytest.mark.parametrize("block", [97, 1 << 16])  # an interval's items split across blocks, or one block
@pytest.mark.parametrize("seed", range(6))
def test_bursts_are_the_autograd_work_between_two_interrupts(seed, block, monkeypatch):
    monkeypatch.setattr(mbdetect, "_BLOCK", block)
    rng = np.random.default_rng(seed)
    sig = name_signals(NAMES, [""])
    p = _process(rng, 3_000, 800)
    f_tid = 1
    interrupts = np.sort(p.l_start[p.l_tid == f_tid])[:: 1 + seed]  # from one item per burst to few bursts
    got = mbdetect._bursts(sig, p, slice(0, len(p.l_start)), slice(0, len(p.start)), f_tid, interrupts)
    assert got == _bursts_by_definition(sig, p, f_tid, interrupts)
    assert len(got) > 1


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
    assert mbdetect._forward_groups(anchors, gemms, bursts) == want
