"""The fast per-file analysis equals simple reference implementations on every real trace.

``kernel_table`` groups on integer codes and classifies through lower-cased twins of the regex rules;
``attribute_ranges`` attributes launches with vectorized searchsorted. The references here are the plain
versions: a pandas string groupby, ``re.IGNORECASE`` search per name, and a per-range Python loop.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tracing.analysis import attribution, kernel_classes, metrics
from tracing.ingest.detect import load_trace
from tracing.outputs import schema

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
TRACES = [
    REAL / "hta_a100_ddp_rank0_hostbound.json.gz",
    REAL / "hta_sampled_2rank" / "rank-0.json.gz",
    REAL / "hta_sampled_2rank" / "rank-1.json.gz",
    REAL / "nsysai_h100x2_mfu_before.sqlite",
]


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.name)
def loaded(request):
    trace = load_trace(request.param)
    ops = metrics.gpu_ops(trace.events)
    return trace, ops


def _reference_class(name: str, rules=kernel_classes.DEFAULT_RULES) -> str:
    for cls, pattern in rules:
        if re.search(pattern, name, re.IGNORECASE):
            return cls
    return "other"


def _reference_kernel_table(ops: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in schema.KERNEL_COLUMNS if c not in ("trace", "rank")]
    df = ops.loc[:, ["device", "kind", "name", "dur_ns"]].copy()
    df["kind"] = df["kind"].astype(str)
    df["name"] = df["name"].astype(str)
    g = df.groupby(["device", "kind", "name"], sort=True, observed=True)["dur_ns"]
    out = g.agg(count="count", total_ns="sum", max_ns="max").reset_index()
    out["mean_ns"] = out["total_ns"] / out["count"]
    out["kernel_class"] = [
        "memcpy" if k == schema.MEMCPY else "memset" if k == schema.MEMSET else _reference_class(n)
        for k, n in zip(out["kind"], out["name"], strict=True)
    ]
    out = out.sort_values(["device", "total_ns"], ascending=[True, False], kind="stable")
    return out.loc[:, cols].astype({c: schema.KERNEL_COLUMNS[c] for c in cols}).reset_index(drop=True)


def test_kernel_table_equals_string_groupby_reference(loaded):
    _, ops = loaded
    assert len(ops) > 0
    fast = kernel_classes.kernel_table(ops, kernel_classes.with_rules([]))  # fresh memo
    pd.testing.assert_frame_equal(fast, _reference_kernel_table(ops), check_exact=True)


def test_kernel_table_classes_do_not_depend_on_the_memo(loaded):
    _, ops = loaded
    first = kernel_classes.kernel_table(ops)
    again = kernel_classes.kernel_table(ops)
    pd.testing.assert_frame_equal(first, again, check_exact=True)


@pytest.mark.parametrize(
    "name",
    [
        "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
        "SM90_XMMA_GEMM_E4M3",
        "Memcpy DtoH (Device -> Pinned)",
        "triton_POI_fused_add_mul_0",
        "ſcale_kernel",  # non-ASCII: the IGNORECASE rule itself is used
        "KELVIN_\u212a_nccl",
        "",
    ],
)
def test_lowercase_twins_match_ignorecase_rules(name):
    fresh = kernel_classes.with_rules([])
    assert fresh.classify(name) == _reference_class(name)


def test_user_rule_with_upper_case_keeps_case_insensitive_semantics():
    clf = kernel_classes.with_rules([("mine", r"MyOp[A-Z]"), ("digits", r"\D\d\d")])
    assert clf.classify("myopx_kernel") == "mine"
    assert clf.classify("xx12") == "digits"
    assert clf.classify("gemm_kernel") == "gemm"


def _reference_attribute(ranges: pd.DataFrame, launched: pd.DataFrame, by, range_keys):
    out = []
    for _, r in ranges.iterrows():
        sel = launched
        for b, k in zip(by, range_keys, strict=True):
            sel = sel[sel[b] == r[k]]
        sel = sel[(sel["launch_start_ns"] >= r["start_ns"]) & (sel["launch_start_ns"] <= r["end_ns"])]
        if len(sel) == 0:
            out.append((0, 0, 0))
            continue
        s, e = sel["start_ns"].to_numpy(), sel["end_ns"].to_numpy()
        busy = 0
        cur_s = cur_e = None
        for a, b in sorted(zip(s.tolist(), e.tolist(), strict=True)):
            if cur_e is None or a > cur_e:
                busy += 0 if cur_e is None else cur_e - cur_s
                cur_s, cur_e = a, b
            else:
                cur_e = max(cur_e, b)
        busy += cur_e - cur_s
        out.append((len(sel), busy, int(e.max() - s.min())))
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def test_attributed_ops_busy_span_equal_per_range_reference(loaded):
    trace, ops = loaded
    table = attribution.attribute_ranges(trace, ops=ops)
    if table["gpu_reason"].ne("").all():
        pytest.skip("no GPU attribution in this trace")
    ranges = attribution.range_frame(trace)
    rows = np.arange(0, len(ranges), max(1, len(ranges) // 300))  # the nsys export has 18.7k ranges
    ranges, table = ranges.iloc[rows], table.iloc[rows]
    launched = ops[ops["launch_start_ns"] != schema.NO_ID]
    for prefix, by, keys in (
        ("thread", ["pid", "launch_tid"], ["pid", "tid"]),
        ("window", ["pid"], ["pid"]),
    ):
        ref = _reference_attribute(ranges, launched, by, keys)
        got = table[[f"{prefix}_ops", f"{prefix}_busy_ns", f"{prefix}_span_ns"]].to_numpy(np.int64)
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("chunk", [1, 7, 1 << 21])
def test_slice_measures_equal_measure_per_slice_across_chunkings(monkeypatch, chunk):
    monkeypatch.setattr(attribution, "_SLICE_CHUNK", chunk)
    rng = np.random.default_rng(7)
    start = rng.integers(4_458_700_000_000_000, 4_458_700_000_100_000, 400)  # Kineto-sized epoch ns
    end = start + rng.integers(0, 5_000, 400)
    lo = rng.integers(0, 399, 60)
    hi = lo + 1 + rng.integers(0, 400 - lo)
    got = attribution._slice_measures(start, end, lo, hi)
    want = [metrics.measure(start[a:b], end[a:b]) for a, b in zip(lo, hi, strict=True)]
    np.testing.assert_array_equal(got, want)


def test_slice_measures_fall_back_when_shifted_times_would_overflow():
    start = np.array([0, 5, 2**61, 2**61 + 3], dtype=np.int64)
    end = np.array([10, 20, 2**61 + 10, 2**61 + 4], dtype=np.int64)
    got = attribution._slice_measures(start, end, np.array([0, 0, 2]), np.array([2, 4, 4]))
    np.testing.assert_array_equal(got, [20, 30, 10])


@pytest.mark.parametrize("block", [1, 3, 64, 1 << 18])
def test_measure_in_blocks_equals_the_union_intervals_sum(monkeypatch, block):
    # measure() sums a block of ops at a time (bounded memory for ranges over millions of ops); the carried
    # running max must give the union's length exactly: touching, nested, duplicate and zero-length ops
    monkeypatch.setattr(metrics, "_MEASURE_BLOCK", block)
    rng = np.random.default_rng(11)
    for _ in range(20):
        n = int(rng.integers(1, 300))
        start = rng.integers(4_458_700_000_000_000, 4_458_700_000_002_000, n)
        end = start + rng.integers(0, 300, n)
        zero = rng.random(n) < 0.1
        end[zero] = start[zero]
        s, e = metrics.union_intervals(start, end)
        assert metrics.measure(start, end) == int((e - s).sum())
    assert metrics.measure(np.zeros(0, np.int64), np.zeros(0, np.int64)) == 0


@pytest.mark.parametrize("block", [1, 2, 5, 1 << 18])
def test_same_stream_overlap_in_blocks_equals_one_pass(monkeypatch, block):
    monkeypatch.setattr(metrics, "_MEASURE_BLOCK", block)
    rng = np.random.default_rng(5)
    for n in (0, 1, 2, 3, 17, 250):
        stream = rng.integers(7, 10, n)
        start = rng.integers(0, 2_000, n)
        end = start + rng.integers(0, 400, n)
        order = np.lexsort((start, stream))
        st, s, e = stream[order], start[order], end[order]
        want = np.clip((np.minimum(e[:-1], e[1:]) - s[1:])[st[1:] == st[:-1]], 0, None).sum()
        assert metrics._same_stream_overlap(stream, start, end) == int(want)
