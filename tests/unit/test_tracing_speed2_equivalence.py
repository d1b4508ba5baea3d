"""The second round of per-file speed-ups gives exactly the tables of the straightforward code they replaced.

Each fast path is checked against a slow reference on every real and quirk trace in ``tests/data``:
bulk microsecond parsing, the categorical-to-string ``gpu_ops`` columns, array-based stream/device
grouping, the array-built range table (its pandas reference builder lives here), and the kernel rules rewritten for the regex engine's literal scan.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tracing.analysis import attribution, kernel_classes, metrics
from tracing.analysis.phases import default_phase_map
from tracing.ingest.detect import load_trace
from tracing.ingest.kineto_time import us_text_to_ns, us_values_to_ns
from tracing.outputs import schema

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = [
    *sorted((DATA / "real").glob("**/*.json.gz")),
    *sorted((DATA / "quirks").glob("*/trace.json")),
    DATA / "real" / "nsysai_h100x2_mfu_before.sqlite",
]


@pytest.fixture(scope="module", params=TRACES, ids=lambda p: p.parent.name + "/" + p.name)
def loaded(request):
    trace = load_trace(request.param)
    return trace, metrics.gpu_ops(trace.events)


@pytest.mark.parametrize(
    "values",
    [
        [1682725898236567, 0, -3, 12],
        ["1.5", "0.0", "-2.5", "-0.5", "123456789012345.7"],
        ["1.25", "-0.05", "7.10"],
        ["4458676522690.655", "-1.001", "0.000"],
        ["1.5", "2.25", "3.125", "4"],  # mixed decimals and no dot: value by value
        [1, "2.5"],
        ["1.250", 0, "-2.125", 7, -3, "0.001"],  # Kineto's int durations among 3-decimal text: in bulk
        [0, "1.5", 12, "-0.5"],  # the first text value sets the decimals
        ["1.25", 10**16, "2.50"],  # an int past the pattern's 15 digits: value by value
        ["1.25", None, "2.50"],  # not a number: the exact path's error
        ["1.25", 2.5, "2.50"],
        [2**62, 1],  # too big for ns in int64: value by value (the caller then reports the overflow)
    ],
)
def test_bulk_microseconds_equal_per_value_conversion(values):
    try:
        want = np.array([us_text_to_ns(v) for v in values], np.int64)
    except (OverflowError, TypeError) as exc:  # the bulk path raises what the exact one does
        with pytest.raises(type(exc)):
            us_values_to_ns(values)
        return
    got = us_values_to_ns(values)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_bulk_microseconds_reject_bool_like_the_exact_path():
    with pytest.raises(TypeError):
        us_values_to_ns([1, True])


def _reference_gpu_ops_head(events: pd.DataFrame) -> pd.DataFrame:
    is_op = metrics.kind_mask(events, schema.GPU_OP_KINDS)
    cols = ["kind", "name", "pid", "device", "stream", "start_ns", "dur_ns", "correlation"]
    ops = pd.DataFrame({c: events[c].to_numpy()[is_op] for c in cols})
    ops["kind"] = ops["kind"].astype(str).astype(object)
    return ops


def test_gpu_ops_string_columns_equal_row_by_row_conversion(loaded):
    trace, ops = loaded
    ref = _reference_gpu_ops_head(trace.events)
    pd.testing.assert_frame_equal(ops[ref.columns], ref, check_exact=True)


def test_gpu_ops_missing_names_equal_row_by_row_conversion(loaded):
    trace, _ = loaded
    events = trace.events.copy()
    codes = events["name"].cat.codes.to_numpy().copy()
    codes[::3] = -1
    events["name"] = pd.Categorical.from_codes(codes, categories=events["name"].cat.categories)
    ref = _reference_gpu_ops_head(events)
    pd.testing.assert_frame_equal(metrics.gpu_ops(events)[ref.columns], ref, check_exact=True)


def _reference_streams(ops: pd.DataFrame, rule: str, threshold: int) -> list[tuple[int, ...]]:
    rows = []
    for key, g in ops.drop(columns=["kind", "name"]).groupby(["pid", "device", "stream"], sort=True):
        g = g.sort_values(["start_ns", "end_ns"], kind="stable")
        s, e = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
        launch = g["launch_start_ns" if rule == "start" else "launch_end_ns"].to_numpy()[1:]
        gap = np.clip(s[1:] - e[:-1], 0, None)
        host = (launch != schema.NO_ID) & (launch > e[:-1])
        kwait = ~host & (gap < threshold)
        rows.append((*map(int, key), len(g), int(gap.sum()), int(gap[host].sum()), int(gap[kwait].sum())))
    return rows


@pytest.mark.parametrize("rule", ["start", "end"])
def test_stream_breakdown_equals_pandas_groupby_reference(loaded, rule):
    trace, ops = loaded
    got = metrics.stream_breakdown(trace.events, rule=rule, ops=ops)
    cols = ["pid", "device", "stream", "num_ops", "idle_ns", "host_wait_ns", "kernel_wait_ns"]
    rows = [tuple(int(v) for v in r) for r in got[cols].itertuples(index=False)]
    assert rows == _reference_streams(ops, rule, metrics.KERNEL_WAIT_THRESHOLD_NS)


def test_device_timelines_equal_per_group_frames(loaded):
    trace, ops = loaded
    got = metrics.device_timelines(trace.events, ops)
    want = [
        metrics.device_timeline(g, int(pid), int(dev)) for (pid, dev), g in ops.groupby(["pid", "device"])
    ]
    assert [(t.pid, t.device, t.row) for t in got] == [(t.pid, t.device, t.row) for t in want]
    for a, b in zip(got, want, strict=True):
        for k in ("busy", "stall"):  # starts and ends
            for x, y in zip(getattr(a, k).arrays(), getattr(b, k).arrays(), strict=True):
                np.testing.assert_array_equal(x, y)


def _reference_range_table(trace, ops) -> pd.DataFrame:
    """The range table built the straightforward pandas way (the builder the array one replaced): names
    split row by row, a DataFrame sort, a Python nesting stack, per-row window ends, one astype at the end."""
    phase_map = default_phase_map()
    if trace.range_log is not None:
        log = trace.range_log
        df = pd.DataFrame(
            {
                "source": "rangelog",
                "range_id": log["range_id"].astype("int64"),
                "parent_id": log["parent_id"].astype("int64"),
                "depth": log["depth"].astype("int64"),
                "name": log["name"].astype(str),
                "domain": "",
                "pid": np.int64(schema.NO_ID),
                "tid": log["tid"].astype("int64"),
                "start_ns": log["start_ns"].astype("int64"),
                "end_ns": log["end_ns"].astype("int64"),
                "attrs": log["attrs"].astype(str),
            }
        )
    else:
        ev = trace.events[trace.events["kind"] == schema.RANGE]
        split = [attribution.split_encoded_name(n) for n in ev["name"].astype(str)]
        df = pd.DataFrame(
            {
                "source": "nvtx" if trace.format == "nsys" else "user_annotation",
                "name": [n for n, _ in split],
                "domain": ev["domain"].astype(str).to_numpy(),
                "pid": ev["pid"].to_numpy(),
                "tid": ev["tid"].to_numpy(),
                "start_ns": ev["start_ns"].to_numpy(),
                "end_ns": (ev["start_ns"] + ev["dur_ns"]).to_numpy(),
                "attrs": [json.dumps(a, sort_keys=True) for _, a in split],
            }
        )
        df = df.sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="stable")
        df = df.reset_index(drop=True)
        df.insert(1, "range_id", np.arange(len(df), dtype=np.int64))
        parent, depth, stacks = [], [], {}
        for i, r in enumerate(df.itertuples(index=False)):
            stack = stacks.setdefault((r.pid, r.tid), [])
            while stack and (stack[-1][1] <= r.start_ns or stack[-1][1] < r.end_ns):
                stack.pop()
            parent.append(stack[-1][0] if stack else schema.NO_ID)
            depth.append(len(stack))
            stack.append((i, r.end_ns))
        df.insert(2, "parent_id", np.array(parent, np.int64))
        df.insert(3, "depth", np.array(depth, np.int64))
    df["wall_ns"] = df["end_ns"] - df["start_ns"]
    df["phase"] = [phase_map.phase_of(n.split(", op_id = ")[0].split(", seq = ")[0]) for n in df["name"]]
    gpu = [c for c, t in schema.RANGE_COLUMNS.items() if t == "Int64"]
    df["time_ns"] = df["wall_ns"]
    if trace.range_log is not None or len(ops) == 0:
        for col in gpu:
            df[col] = pd.array([pd.NA] * len(df), dtype="Int64")
        df["gpu_reason"] = (
            attribution.RANGELOG_REASON if trace.range_log is not None else attribution.NO_GPU_REASON
        )
    else:
        launched = ops[ops["launch_start_ns"] != schema.NO_ID]
        for prefix, by, keys in (
            ("thread", ["pid", "launch_tid"], ["pid", "tid"]),
            ("window", ["pid"], ["pid"]),
        ):
            n_ops, busy, first, last = attribution._attribute(
                [df[k].to_numpy(np.int64) for k in keys],
                df["start_ns"].to_numpy(np.int64),
                df["end_ns"].to_numpy(np.int64),
                {c: launched[c].to_numpy(np.int64) for c in (*by, "launch_start_ns", "start_ns", "end_ns")},
                by,
            )
            df[f"{prefix}_ops"], df[f"{prefix}_busy_ns"] = n_ops, busy
            df[f"{prefix}_span_ns"] = np.where(n_ops > 0, last - first, 0)
            if prefix == "window":
                df["gpu_end_ns"] = pd.array(
                    [int(x) if k else pd.NA for x, k in zip(last, n_ops > 0, strict=True)], dtype="Int64"
                )
        window_end = [
            max(e, g) if not pd.isna(g) else e for e, g in zip(df["end_ns"], df["gpu_end_ns"], strict=True)
        ]
        df["time_ns"] = np.array(window_end, np.int64) - df["start_ns"].to_numpy()
        timelines = metrics.device_timelines(trace.events, ops)
        df["busy_in_window_ns"], df["host_stall_ns"] = attribution.clipped_device_time(
            df["pid"].to_numpy(), df["start_ns"].to_numpy(), np.array(window_end, np.int64), timelines
        )
        df["gpu_reason"] = ""
    cols = [c for c in schema.RANGE_COLUMNS if c not in ("trace", "rank")]
    return df.loc[:, cols].astype({c: schema.RANGE_COLUMNS[c] for c in cols})


def test_array_built_range_table_equals_frame_built_one(loaded):
    trace, ops = loaded
    fast = attribution.attribute_ranges(trace, ops=ops)
    pd.testing.assert_frame_equal(fast, _reference_range_table(trace, ops), check_exact=True)


def test_range_log_range_table_equals_frame_built_one(tmp_path):
    from tracing.capture.ranges import RangeLog
    from tracing.ingest.rangelog import load_range_log
    from tracing.outputs import store

    log = RangeLog(emit_nvtx=False, emit_profiler=False)
    with log.range("update", step=0), log.range("update/microbatch", step=0, microbatch=0, tokens=12):
        pass
    store.write_table(log.to_frame(), tmp_path / store.RANGES)
    trace = load_range_log(tmp_path)
    ops = metrics.gpu_ops(trace.events)
    table = attribution.attribute_ranges(trace, ops=ops)
    assert (
        table["name"].tolist() == ["update", "update/microbatch"]
        and (table["time_ns"] == table["wall_ns"]).all()
    )
    pd.testing.assert_frame_equal(table, _reference_range_table(trace, ops), check_exact=True)


OLD_RULES = (
    (
        "communication",
        r"nccl|ncclDevKernel|ncclKernel|all_?reduce|all_?gather|reduce_?scatter|alltoall|sendrecv|"
        r"cross_device_reduce|\bmsccl|\brccl|nvshmem",
    ),
    ("attention", kernel_classes.DEFAULT_RULES[1][1]),
    (
        "gemm",
        r"gemm|matmul|cublas|cutlass|nvjet|xmma|wgmma|hmma|\bmma|sm\d+_.*(tensorop|gemm)|ampere_|volta_|"
        r"turing_|hopper_|_nn_|_nt_|_tn_|_tt_|splitkreduce|dot_?product|bmm",
    ),
    ("quantize", kernel_classes.DEFAULT_RULES[3][1]),
    ("elementwise", kernel_classes.DEFAULT_RULES[4][1]),
)


def test_rewritten_default_rules_classify_like_the_original_case_insensitive_rules():
    old = [(cls, re.compile(p, re.IGNORECASE)) for cls, p in OLD_RULES]

    def reference(name: str) -> str:
        return next((cls for cls, p in old if p.search(name)), "other")

    frags = ["msccl", "MSCCL", "rccl", "mma", "MMA", "_", "x", "a", "sm90_", "sm8_", "gemm", "TensorOp"]
    frags += ["ncclDevKernel", " ", "-", "\u0131", "K", "\u212a", "9", "Scale", "void at::native::"]
    rng = random.Random(0)
    names = ["".join(rng.choice(frags) for _ in range(rng.randint(1, 5))) for _ in range(5000)]
    for path in TRACES:
        names += [str(n) for n in metrics.gpu_ops(load_trace(path).events)["name"].dropna().unique()]
    fresh = kernel_classes.KernelClassifier(kernel_classes.DEFAULT.rules)
    assert [fresh.classify(n) for n in names] == [reference(n) for n in names]


@pytest.mark.parametrize(
    ("pattern", "safe"),
    [
        ("ncclDevKernel|x", True),
        (r"Foo\D", False),
        ("[A-z]x", False),
        ("(?i)Ab", False),
        ("caf\u00c9", False),
    ],
)
def test_lower_twin_only_for_patterns_whose_upper_case_letters_are_literals(pattern, safe):
    assert (kernel_classes._lower_twin(pattern) is not None) is safe


def test_class_totals_equal_pandas_groupby_on_real_and_tie_heavy_tables(loaded):
    _, ops = loaded
    tables = [kernel_classes.kernel_table(ops)]
    rng = np.random.default_rng(3)
    for _ in range(50):  # few distinct totals: many ties, and devices whose time is all zero (share NaN)
        n = int(rng.integers(1, 30))
        tables.append(
            pd.DataFrame(
                {
                    "device": rng.integers(0, 3, n),
                    "kernel_class": pd.array(rng.choice(list(kernel_classes.CLASSES), n), dtype="string"),
                    "total_ns": rng.integers(0, 3, n) * 1000,
                }
            )
        )
    for table in tables:
        pd.testing.assert_frame_equal(
            kernel_classes.class_totals(table), kernel_classes._class_totals_groupby(table), check_exact=True
        )
