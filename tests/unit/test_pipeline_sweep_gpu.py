"""A traced sweep's GPU columns on a (hand-written) GPU trace: the part of `mxperf sweep --trace` that needs a
GPU to produce its input, checked on CPU with the same ingest code."""

from __future__ import annotations

import json

import pandas as pd

from pipeline.experiments.sweep_tables import gpu_columns, profiler_overhead
from tracing.ingest.kineto import load_kineto_events


def _x(cat, name, ts, dur, *, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _trace(tmp_path):
    """Two micro-batches of one learner step; each launches one kernel (the second one 40 us late)."""
    ev = [
        _x("user_annotation", "update/microbatch[step=3,microbatch=0,tokens=64,precision=mxfp8]", 0, 100),
        _x("cuda_runtime", "cudaLaunchKernel", 10, 5, correlation=1),
        _x("kernel", "gemm_a", 20, 30, pid=0, tid=7, device=0, stream=7, correlation=1),
        _x("user_annotation", "update/microbatch[step=3,microbatch=1,tokens=64,precision=mxfp8]", 100, 100),
        _x("cuda_runtime", "cudaLaunchKernel", 105, 85, correlation=2),
        _x("kernel", "gemm_b", 190, 5, pid=0, tid=7, device=0, stream=7, correlation=2),
    ]
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    return load_kineto_events(path)


def _table(*keys):
    return pd.DataFrame(
        {"precision": [k[0] for k in keys], "step": [k[1] for k in keys], "microbatch": [k[2] for k in keys]}
    )


def test_microbatches_get_the_busy_and_stall_of_their_own_window(tmp_path):
    out, reason = gpu_columns(_table(("mxfp8", 3, 0), ("mxfp8", 3, 1)), _trace(tmp_path))
    assert reason == ""
    assert out["gpu_busy_seconds"].tolist() == [30_000 / 1e9, 5_000 / 1e9]  # 30 us, 5 us
    # the gap before gemm_b (50 us -> 190 us) is the GPU waiting for its launch call, which returns at 190 us;
    # each micro-batch gets the part inside its own window: [50, 100) and [100, 190)
    assert out["host_stall_seconds"].tolist() == [50_000 / 1e9, 90_000 / 1e9]


def test_rows_without_a_matching_range_stay_null_and_say_why(tmp_path):
    out, reason = gpu_columns(_table(("bf16", 3, 0), ("mxfp8", 3, 1)), _trace(tmp_path))
    assert out["gpu_busy_seconds"].isna().tolist() == [True, False]
    assert reason.startswith("1 of 2 traced micro-batches have no update/microbatch range")


def test_rows_outside_the_traced_window_stay_null_and_are_counted(tmp_path):
    table = _table(("mxfp8", 3, 0), ("mxfp8", 3, 1), ("mxfp8", 2, 0))
    table["traced"] = [True, True, False]
    out, reason = gpu_columns(table, _trace(tmp_path))
    assert out["gpu_busy_seconds"].isna().tolist() == [False, False, True]
    assert reason == "1 micro-batches outside the traced window have no GPU columns"


def test_profiler_overhead_compares_the_same_cells_traced_and_untraced():
    rows = []
    for step, (traced, seconds) in enumerate([(False, 1.0), (False, 1.2), (True, 1.5)]):
        for mb in range(2):  # two micro-batches per step: step seconds are their sum
            rows.append(
                {"precision": "bf16", "tokens_per_microbatch": 64, "global_tokens": 128, "step": step,
                 "microbatch": mb, "seconds": seconds / 2, "traced": traced}
            )  # fmt: skip
    out = profiler_overhead(pd.DataFrame(rows))
    assert out is not None and out["cells"] == 1
    assert abs(out["median_ratio"] - 1.5 / 1.1) < 1e-12  # traced median / untraced median (of 1.0 and 1.2)
    assert profiler_overhead(pd.DataFrame(rows).assign(traced=False)) is None  # nothing to compare
