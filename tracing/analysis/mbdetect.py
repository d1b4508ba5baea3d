"""Micro-batches found in a trace without labels: cut inside each phase range from what every transformer
forward/backward leaves, or taken from explicit micro-batch ranges.

Where to look: :mod:`tracing.analysis.mbregions`; an explicit range that holds several forward passes is split.
The cut (the thread F that opened the range, its embedding lookups, the backward bursts on the autograd
threads, the tokens) is drawn in docs/tracing.md ("Micro-batches", **How**). Each forward must own one
backward (update) or none may (logprob); anything else is *ambiguous*: the range gets a reason and no
micro-batches, never a guess.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing.analysis.mbregions import Region
from tracing.analysis.mbsignals import Process, Signals, start_slice

if TYPE_CHECKING:
    from tracing.analysis.mb_engine import EngineItems

    Items = EngineItems | Process  # a process's items from the engine, or held whole (a slab, tests)

_BLOCK = 1 << 16  # items per block where a whole region's items are scanned
FORWARD_ONLY_PHASES = ("logprob", "reward")  # phases whose micro-batches run forwards only


@dataclass(frozen=True)
class Cut:
    """One micro-batch's host extent and what it processed (times in ns on the trace's clock)."""

    pid: int
    tid: int
    phase: str | None  # None: no phase range says (decided by the caller)
    step: int
    start_ns: int
    host_end_ns: int
    tokens: int | None
    tokens_from: str  # embedding | gemm | attrs | "" (unknown)
    source: str  # range | detected
    backward: bool
    attrs: dict[str, Any] = field(default_factory=dict)
    model: str | None = None  # from the embedding table's shape
    microbatch: int | None = None  # index from explicit attributes
    unit: str = "unknown"  # what ``tokens`` counts: tokens | images | unknown (tokens_from gemm: its input)


@dataclass
class Finding:
    """What one region gave: cuts, or a reason why none."""

    region: Region
    cuts: list[Cut]
    reason: str = ""  # "" = fine; else why the region has no micro-batches
    by_forwards: bool = False  # cut at forward passes (embedding lookups), not only at backward passes


def cut_region(sig: Signals, region: Region) -> Finding:
    """Micro-batches inside one region (see the module docstring).

    The region is read a block at a time (which thread is F; its embedding lookups; the backward bursts; its
    last GEMM before each lookup or burst); each micro-batch's boundaries then read only its neighbourhood
    (``p.window``): a region as large as a whole process is never held."""
    p = sig.processes.get(region.pid)
    if p is None:
        return Finding(region, [], "the trace records no ops or launches in the range (ranges only)")
    f_tid = _forward_thread(sig, p, region)
    sv = _survey(sig, p, region, f_tid)
    bursts = _bursts(sig, p, region, f_tid, sv.anchor_start, sv.autograd)
    if len(sv.anchor_start):
        gemm_before = _last_gemm_before(sig, p, region, f_tid, sv.anchor_start)
        groups = _towers(sig, sv, _forward_groups(sv.anchor_start, gemm_before, bursts), bursts)
        return _cuts_from_forwards(sig, p, region, f_tid, sv, groups, bursts)
    if len(bursts):
        gemm_before = _last_gemm_before(sig, p, region, f_tid, np.array([b[0] for b in bursts], np.int64))
        return _cuts_from_backwards(sig, p, region, f_tid, bursts, gemm_before)
    if sv.any_gemm:
        return Finding(
            region,
            [],
            "forward passes but no embedding lookups (trace without CPU ops, or nsys without emit_nvtx) and no "
            "backward passes: micro-batch boundaries cannot be told apart",
        )
    return Finding(region, [], "no forward or backward passes in the range")


def _window(sorted_start: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Indices of the items starting in [lo, hi] (``sorted_start`` ascending)."""
    rows = start_slice(sorted_start, lo, hi)
    return np.arange(rows.start, rows.stop)


def _forward_thread(sig: Signals, p: Items, region: Region) -> int:
    """The range's own thread when it ran forward work; else the thread with the most embedding lookups,
    else the one with the most launches (a range opened on one thread for work run on another)."""
    tid, r0, r1 = region.tid, region.start_ns, region.end_ns
    on_tid = emb_on_tid = launch_on_tid = False
    emb_tids: Counter[int] = Counter()
    for b in p.host_blocks(r0, r1, ("tid", "code"), _BLOCK):
        on, emb = b["tid"] == tid, sig.is_embedding[b["code"]]
        on_tid, emb_on_tid = on_tid or bool(on.any()), emb_on_tid or bool((on & emb).any())
        _count_values(emb_tids, b["tid"][emb])
    launch_tids: Counter[int] = Counter()
    for b in p.launch_blocks(r0, r1, ("l_tid",), _BLOCK):
        launch_on_tid = launch_on_tid or bool((b["l_tid"] == tid).any())
        _count_values(launch_tids, b["l_tid"])
    if on_tid and (launch_on_tid or emb_on_tid):
        return tid
    pool = emb_tids or launch_tids
    if not pool:
        return tid
    top = max(pool.values())
    return min(t for t, k in pool.items() if k == top)  # np.unique + argmax: the smallest of the most


def _count_values(counts: Counter[int], values: np.ndarray) -> None:
    v, k = np.unique(values, return_counts=True)
    counts.update(dict(zip(v.tolist(), k.tolist(), strict=True)))


@dataclass
class _Survey:
    """What a region's cut needs of all of it (small: a few entries per forward pass)."""

    anchor_start: np.ndarray  # F's embedding lookups (start order), their names and shapes
    anchor_code: np.ndarray
    anchor_shape: np.ndarray
    any_gemm: bool  # F launched a GEMM kernel or ran a GEMM op
    autograd: list[int]  # threads other than F that ran autograd ops, ascending


def _survey(sig: Signals, p: Items, region: Region, f_tid: int) -> _Survey:
    r0, r1 = region.start_ns, region.end_ns
    anchors: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    any_gemm, autograd = False, set()
    for b in p.host_blocks(r0, r1, ("tid", "start", "code", "shape"), _BLOCK):
        on_f, code = b["tid"] == f_tid, b["code"]
        a = on_f & sig.is_embedding[code]
        anchors.append((b["start"][a], code[a], b["shape"][a]))
        any_gemm = any_gemm or bool((on_f & (sig.gemm_arg[code] >= 0)).any())
        autograd.update(np.unique(b["tid"][sig.is_autograd[code] & ~on_f]).tolist())
    for b in p.launch_blocks(r0, r1, ("l_tid", "l_gemm"), _BLOCK) if not any_gemm else ():
        any_gemm = any_gemm or bool(((b["l_tid"] == f_tid) & b["l_gemm"]).any())
    a_start, a_code, a_shape = (
        np.concatenate([np.zeros(0, np.int64), *(x[k] for x in anchors)]).astype(np.int64) for k in range(3)
    )
    kinds, inverse = np.unique(a_shape, return_inverse=True)  # token tables only (not position / bias tables)
    token = sig.token_tables(kinds.tolist())[inverse] if len(kinds) else np.zeros(0, bool)
    return _Survey(a_start[token], a_code[token], a_shape[token], any_gemm, sorted(autograd))


def _bursts(
    sig: Signals, p: Items, region: Region, f_tid: int, anchor_start: np.ndarray, tids: list[int]
) -> list[tuple[int, int]]:
    """(start, end) of each backward burst: work of the autograd threads ``tids`` between two interrupts -- F's
    launches and embedding lookups (``anchor_start``) --, a block of the region at a time. An item's interval
    is the number of interrupts at or before its start, F's launches counted as a second stream is read
    alongside (:class:`_Count`), so nothing is held per launch."""
    r0, r1 = region.start_ns, region.end_ns

    def f_launches() -> Iterator[tuple[np.ndarray, int]]:
        for b in p.launch_blocks(r0, r1, ("l_tid", "l_start"), _BLOCK):
            yield b["l_start"][b["l_tid"] == f_tid], int(b["l_start"][-1])

    def interval_of(count: _Count, starts: np.ndarray) -> np.ndarray:
        return count.at(starts) + np.searchsorted(anchor_start, starts, side="right")

    # per block of each part (launches, host items; each in start order, so an interval's items are
    # consecutive) each interval's first start and last end, then every block's intervals merged
    spans = []
    count = _Count(f_launches())
    for b in p.launch_blocks(r0, r1, ("l_tid", "l_start", "l_end"), _BLOCK):
        # no autograd ops (no op names: nsys without emit_nvtx): any other launching thread's launches
        b_l = _on_threads(b["l_tid"], tids) if tids else b["l_tid"] != f_tid
        s = b["l_start"][b_l]
        spans.append(_interval_spans(s, b["l_end"][b_l], interval_of(count, s)))
    count = _Count(f_launches())
    for b in p.host_blocks(r0, r1, ("tid", "start", "end"), _BLOCK) if tids else ():
        b_h = _on_threads(b["tid"], tids)
        s = b["start"][b_h]
        spans.append(_interval_spans(s, b["end"][b_h], interval_of(count, s)))
    if not spans:
        return []
    keys, lo, hi = zip(*spans, strict=True)
    key, starts, ends = (np.concatenate(x) for x in (keys, lo, hi))
    if len(key) == 0:
        return []
    order = np.argsort(key, kind="stable")
    first = np.flatnonzero(np.diff(key[order], prepend=-1))
    lo_all = np.minimum.reduceat(starts[order], first)
    hi_all = np.maximum.reduceat(ends[order], first)
    return sorted(zip(lo_all.tolist(), hi_all.tolist(), strict=True))


def _on_threads(tid: np.ndarray, tids: list[int]) -> np.ndarray:
    out = tid == tids[0]
    for t in tids[1:]:
        out |= tid == t
    return out


class _Count:
    """#{x <= t} over values read in ascending order a block at a time (``(values, the block's last time)``:
    a block may hold no values), for queries that never go back in time; holds one block."""

    def __init__(self, blocks: Iterator[tuple[np.ndarray, int]]) -> None:
        self._it = blocks
        self._buf = np.zeros(0, np.int64)  # values read, not yet counted in _base
        self._base = 0
        self._last: int | None = None  # the last block's last time: unread values are at or after it
        self._done = False

    def at(self, t: np.ndarray) -> np.ndarray:
        """The count at each of ``t`` (non-decreasing, none before an earlier call's)."""
        out = np.empty(len(t), np.int64)
        i = 0
        while i < len(t):
            if not self._done and (self._last is None or self._last <= t[i]):  # unread values may be <= t[i]
                self._base += len(self._buf)  # every value held is <= t[i] <= every query from now on
                nxt = next(self._it, None)
                if nxt is None:
                    self._done, self._buf = True, np.zeros(0, np.int64)
                else:
                    self._buf, self._last = nxt
                continue
            j = len(t) if self._done else int(np.searchsorted(t, self._last, side="left"))
            out[i:j] = self._base + np.searchsorted(self._buf, t[i:j], side="right")
            k = int(np.searchsorted(self._buf, t[j - 1], side="right"))  # counted for every later query
            self._base, self._buf = self._base + k, self._buf[k:]
            i = j
        return out


def _last_gemm_before(sig: Signals, p: Items, region: Region, f_tid: int, queries: np.ndarray) -> np.ndarray:
    """For each of ``queries`` (ascending), the start of F's last GEMM (a GEMM kernel launch or a GEMM host op)
    before it, or the int64 minimum: one pass over the region, a block at a time."""
    r0, r1 = region.start_ns, region.end_ns
    best = np.full(len(queries), np.iinfo(np.int64).min, np.int64)

    def take(g: np.ndarray) -> None:  # g ascending
        i = np.searchsorted(g, queries, side="left") - 1
        hit = i >= 0
        best[hit] = np.maximum(best[hit], g[i[hit]])

    for b in p.host_blocks(r0, r1, ("tid", "start", "code"), _BLOCK):
        take(b["start"][(b["tid"] == f_tid) & (sig.gemm_arg[b["code"]] >= 0)])
    for b in p.launch_blocks(r0, r1, ("l_tid", "l_start", "l_gemm"), _BLOCK):
        take(b["l_start"][(b["l_tid"] == f_tid) & b["l_gemm"]])
    return best


def _interval_spans(
    starts: np.ndarray, ends: np.ndarray, key: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Items in start order grouped by the interval between interrupts they start in (``key``: the number of
    interrupts at or before each start): each interval's key, first start and last end."""
    first = np.flatnonzero(np.diff(key, prepend=-1)) if len(key) else np.zeros(0, np.int64)
    if len(first) == 0:
        return key[:0], starts[:0], ends[:0]
    return key[first], starts[first], np.maximum.reduceat(ends, first)


def _forward_groups(
    anchor_start: np.ndarray, gemm_before: np.ndarray, bursts: list[tuple[int, int]]
) -> list[list[int]]:
    """Embedding lookups of one forward (e.g. GPT-2's token + position embeddings): consecutive lookups
    with no GEMM and no backward between them (``gemm_before``: per lookup, F's last GEMM before it)."""
    b_starts = np.array([b[0] for b in bursts], np.int64)  # ascending: bursts are sorted
    groups: list[list[int]] = [[0]] if len(anchor_start) else []
    for j in range(1, len(anchor_start)):
        lo, hi = anchor_start[j - 1], anchor_start[j]
        gemm_between = gemm_before[j] > lo
        bwd_between = np.searchsorted(b_starts, hi) > np.searchsorted(b_starts, lo, side="right")
        if gemm_between or bwd_between:
            groups.append([j])
        else:
            groups[-1].append(j)
    return groups


def _towers(
    sig: Signals, sv: _Survey, groups: list[list[int]], bursts: list[tuple[int, int]]
) -> list[list[int]]:
    """One model call through several towers (a text and an image encoder) is one forward: consecutive forward
    groups with no backward between them whose tables the call has not looked up yet are merged. The same
    table again is another forward (a next micro-batch, or a pipeline schedule's)."""
    b_starts = np.array([b[0] for b in bursts], np.int64)
    out: list[list[int]] = []
    seen: set[tuple[int, int] | None] = set()
    for g in groups:
        tables = {sig.table_of(int(sv.anchor_shape[j])) for j in g}
        if out:
            lo, hi = sv.anchor_start[out[-1][0]], sv.anchor_start[g[0]]
            bwd = np.searchsorted(b_starts, hi) > np.searchsorted(b_starts, lo, side="right")
            if not bwd and None not in tables | seen and not tables & seen:
                out[-1] += g
                seen |= tables
                continue
        out.append(list(g))
        seen = tables
    return out


def _cuts_from_forwards(
    sig: Signals,
    p: Items,
    region: Region,
    f_tid: int,
    sv: _Survey,
    groups: list[list[int]],
    bursts: list[tuple[int, int]],
) -> Finding:
    g_start = np.array([sv.anchor_start[g[0]] for g in groups], np.int64)
    owner = np.searchsorted(g_start, [b[0] for b in bursts], side="right") - 1
    if (owner < 0).any():
        return Finding(region, [], "a backward pass before the range's first forward pass (pipeline stage?)")
    n_bwd = np.bincount(owner, minlength=len(groups)) if len(bursts) else np.zeros(len(groups), np.int64)
    if len(bursts) and (n_bwd == 0).any():
        k = int((n_bwd == 0).sum())
        return Finding(
            region,
            [],
            f"{k} of {len(groups)} forward passes have no backward pass of their own: forwards and backwards "
            "interleave (a pipeline-parallel schedule?) or extra forwards run in the range",
        )
    n = len(groups)
    nxt = [*(int(g) for g in g_start[1:]), region.end_ns]
    mine: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for b, o in zip(bursts, owner.tolist(), strict=True):  # each forward's bursts, in order
        mine[o].append(b)
    # host ends of forward+backward micro-batches first (backward, then the sync right after it) ...
    ends: list[int | None] = [
        _after_backward(sig, p, f_tid, max(b[1] for b in mine[i]), nxt[i]) if mine[i] else None
        for i in range(n)
    ]
    # ... then each forward's first host op, which bounds a forward-only micro-batch before it
    lo = [region.start_ns, *(ends[i] if ends[i] is not None else int(g_start[i]) for i in range(n - 1))]
    starts = [_prep_start(sig, p, f_tid, lo[i], int(g_start[i])) for i in range(n)]
    cuts = []
    for i, g in enumerate(groups):
        end, backward = ends[i], bool(mine[i])
        if end is None:  # no backward burst: up to the next forward's first host op (the last: its own sync)
            limit = (
                starts[i + 1] if i + 1 < n else _before_trailing_sync(sig, p, f_tid, starts[i], region.end_ns)
            )
            opt = p.opt_start[p.opt_start > starts[i]]  # never into the optimizer step after it
            limit = min(limit, int(opt[0])) if len(opt) else limit
            w = p.window(starts[i], limit)
            f_items = np.flatnonzero((w.tid == f_tid) & (w.start < limit))  # host items in [start, limit)
            end = int(w.end[f_items].max()) if len(f_items) else starts[i]
            # a CPU trace runs the backward on the calling thread: autograd ops on F, not a burst elsewhere
            backward = bool(sig.is_autograd[w.code[f_items]].any())
        lookups = [(int(sv.anchor_code[j]), int(sv.anchor_shape[j])) for j in g]
        tokens = [sig.tokens_of(c, k) for c, k in lookups]
        known = [t for t in tokens if t]
        model = next((m for m in (sig.model_of(c, k) for c, k in lookups) if m), None)
        tokens_i, unit = (max(known), "tokens") if known else _gemm_size(sig, p, f_tid, starts[i], nxt[i])
        how = "embedding" if known else "gemm" if tokens_i else ""
        cuts.append(
            _detected(region, f_tid, starts[i], end, tokens_i, how, backward=backward, model=model, unit=unit)
        )
    if not any(c.backward for c in cuts) and region.phase not in FORWARD_ONLY_PHASES:
        return Finding(
            region,
            [],
            f"{n} forward passes and no backward pass, outside a logprob / reward range: inference (a decode or "
            "diffusion loop?), not training micro-batches",
        )
    return Finding(region, cuts, by_forwards=True)


def _before_trailing_sync(sig: Signals, items: Items, f_tid: int, lo: int, hi: int) -> int:
    """Where a range's last forward-only micro-batch ends: before the first sync on F after its last kernel
    launch (the range returning its results, ``.cpu()``), else at the range's end."""
    p = items.window(lo, hi)  # items starting in [lo, hi] only: every index below is inside the window
    li = np.flatnonzero((p.l_tid == f_tid) & p.l_kernel)
    if len(li) == 0:
        return hi
    w = _window(p.start, int(p.l_start[li[-1]]), hi)
    w = w[(p.tid[w] == f_tid) & sig.is_sync[p.code[w]]]
    return int(p.start[w[0]]) if len(w) else hi


def _prep_start(sig: Signals, items: Items, f_tid: int, prev_end: int, anchor: int) -> int:
    """A forward's first host op: its embedding lookup, or earlier host ops on F that launch no kernel and
    compute nothing -- moving the micro-batch to the GPU (``micro_batch.to(device)``: copies), slicing it --
    back to the previous micro-batch's end, the last kernel F launched, the last GEMM or autograd op on F,
    or the end of an optimizer range."""
    p = items.window(prev_end, anchor)
    lo = prev_end
    kernels = (p.l_tid == f_tid) & p.l_kernel & (p.l_start < anchor)
    if kernels.any():
        lo = max(lo, int(p.l_end[kernels].max()))
    hi = np.flatnonzero((p.tid == f_tid) & (p.start < anchor))
    compute = hi[(sig.gemm_arg[p.code[hi]] >= 0) | sig.is_autograd[p.code[hi]]]
    if len(compute):
        lo = max(lo, int(p.end[compute].max()))
    done = p.opt_end[(p.opt_end <= anchor)]
    if len(done):
        lo = max(lo, int(done.max()))
    w = _window(p.start, lo, anchor)
    w = w[(p.tid[w] == f_tid) & (p.start[w] >= lo) & ~_inside(p.start[w], p.opt_start, p.opt_end)]
    return int(p.start[w].min()) if len(w) else anchor


def _detected(region: Region, tid: int, start: int, end: int, tokens: int | None, how: str, **kw: Any) -> Cut:
    """A detected cut of ``region`` on thread ``tid`` (``kw``: ``backward``, ``model``, ``unit``)."""
    return Cut(region.pid, tid, region.phase, region.step, start, end, tokens, how, "detected", **kw)


def _after_backward(sig: Signals, items: Items, f_tid: int, burst_end: int, limit: int) -> int:
    """Host end of a micro-batch whose backward ended at ``burst_end``: the sync F runs right after it
    (``loss.item()``), if any comes before F launches its next kernel (or ``limit``)."""
    p = items.window(burst_end, limit)
    f_kernels = np.flatnonzero((p.l_tid == f_tid) & p.l_kernel)
    stop = int(p.l_start[f_kernels[0]]) if len(f_kernels) else limit
    hi = _window(p.start, burst_end, stop)
    hi = hi[(p.tid[hi] == f_tid) & (p.start[hi] < stop)]
    syncs = hi[sig.is_sync[p.code[hi]]]
    return max(burst_end, int(p.end[syncs].max())) if len(syncs) else burst_end


def _gemm_size(sig: Signals, items: Items, f_tid: int, lo: int, hi: int) -> tuple[int | None, str]:
    """Rows of F's first GEMM op in [lo, hi] and what they count: images when F ran a convolution there, tokens
    when the GEMM's input has a sequence axis (``[B, S, H]``), else unknown (``[N, H]``: tokens or samples)."""
    p = items.window(lo, hi)
    w = np.flatnonzero(p.tid == f_tid)
    conv = bool(sig.is_conv[p.code[w]].any())
    for k in w[sig.gemm_arg[p.code[w]] >= 0].tolist():
        code, shape = int(p.code[k]), int(p.shape[k])
        t = sig.tokens_of(code, shape)
        if t:
            return t, "images" if conv else "tokens" if sig.input_rank(code, shape) >= 3 else "unknown"
    return None, "unknown"


def _cuts_from_backwards(
    sig: Signals,
    p: Items,
    region: Region,
    f_tid: int,
    bursts: list[tuple[int, int]],
    gemm_before: np.ndarray,
) -> Finding:
    """No embedding lookups: one micro-batch per backward; its forward is F's work since the previous one.

    Bursts with no GEMM launched from F between them are one backward that F interrupted (a hook's launch).
    """
    merged = [list(bursts[0])]
    for (b0, b1), gemm in zip(bursts[1:], gemm_before[1:].tolist(), strict=True):
        prev_end = merged[-1][1]
        forward_between = gemm >= prev_end  # a GEMM from F in [prev_end, b0)
        if forward_between:
            merged.append([b0, b1])
        else:
            merged[-1][1] = max(merged[-1][1], b1)
    cuts = []
    prev_end = region.start_ns
    for i, (b0, b1) in enumerate(merged):
        nxt = merged[i + 1][0] if i + 1 < len(merged) else region.end_ns
        w = p.window(prev_end, b0)  # F's first item starting in [prev_end, b0) outside the optimizer ranges
        f_start = w.start[(w.tid == f_tid) & (w.start < b0)]
        f_start = f_start[~_inside(f_start, p.opt_start, p.opt_end)]
        start = int(f_start[0]) if len(f_start) else b0
        end = _after_backward(sig, p, f_tid, b1, nxt)
        tokens, unit = _gemm_size(sig, p, f_tid, start, b0)
        cuts.append(
            _detected(region, f_tid, start, end, tokens, "gemm" if tokens else "", backward=True, unit=unit)
        )
        prev_end = end
    return Finding(region, cuts)


def _inside(t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Which times fall inside one of the sorted, non-overlapping intervals [lo, hi)."""
    if len(lo) == 0:
        return np.zeros(len(t), bool)
    i = np.searchsorted(lo, t, side="right") - 1
    return (i >= 0) & (t < hi[np.maximum(i, 0)])


def explicit_cut(sig: Signals, r: Any, phase: str | None) -> Finding:
    """An explicit micro-batch range: one micro-batch, or several when it holds several forwards.

    Attributes it carries (``step``, ``microbatch``, ``tokens``) win; one that is not a non-negative
    integer is ignored (the structure inside the range decides, as without it)."""
    region = Region(int(r.pid), int(r.tid), phase, int(r.start_ns), int(r.end_ns), -1, str(r.name))
    attrs = json.loads(r.attrs) if isinstance(r.attrs, str) and r.attrs else {}
    step, index = _count(attrs.get("step")), _count(attrs.get("microbatch"))
    tokens = _count(attrs.get("tokens", attrs.get("num_tokens")))
    inner = cut_region(sig, region) if region.pid in sig.processes else Finding(region, [])
    if len(inner.cuts) >= 2 and inner.by_forwards and tokens is None:
        return inner  # several forward passes (embedding lookups) inside one "micro-batch" range: split
    first = inner.cuts[0] if inner.cuts else None
    cut = Cut(
        pid=region.pid,
        tid=region.tid,
        phase=phase,
        step=-1 if step is None else step,
        start_ns=region.start_ns,
        host_end_ns=region.end_ns,
        tokens=tokens if tokens else (first.tokens if first else None),
        tokens_from="attrs" if tokens else (first.tokens_from if first else ""),
        source="range",
        backward=first.backward if first else False,
        attrs=attrs,
        model=first.model if first else None,
        microbatch=index,
        unit="tokens" if tokens else (first.unit if first else "unknown"),
    )
    return Finding(region, [cut])


def _count(value: Any) -> int | None:
    """A non-negative integer attribute (``3``, ``"3"``, ``3.0``), else None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) and number >= 0 and number == int(number) else None
