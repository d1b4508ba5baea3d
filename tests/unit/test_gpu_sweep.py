"""The GPU sweep (benchmarks/gpu_sweep.py) on CPU: everything but the CUDA calls -- shapes, FP8 numerics
against mxperf's FP8 grids, the stack, the output contract, the shell wrapper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_sweep as gs  # noqa: E402

TINY = ["--device", "cpu", "--model", "tiny-dense", "--layers", "1", "--tokens", "32,64", "--repeats", "2"]


def test_qwen3_8b_linear_shapes() -> None:
    s = gs.shape_from_preset("qwen3-8b")
    assert s.linears == {
        "qkv_proj": (6144, 4096),
        "o_proj": (4096, 4096),
        "gate_up_proj": (24576, 4096),
        "down_proj": (4096, 12288),
    }
    assert s.flops_per_token(1) == 2 * 4096 * (6144 + 4096 + 24576 + 12288)


@pytest.mark.parametrize("rowwise", [False, True])
def test_fp8_quantization_is_mxperfs_fp8_grid(rowwise: bool) -> None:
    from pipeline.quant import quantize_fp8_rowwise, quantize_fp8_tensor

    x = torch.randn(64, 128) * torch.logspace(-2, 2, 128)
    data, scale = gs.quantize_fp8(x, rowwise)
    ref = quantize_fp8_rowwise(x) if rowwise else quantize_fp8_tensor(x)
    assert torch.equal(data.view(torch.uint8), ref.data)
    assert torch.allclose(scale.reshape(ref.scale.shape), ref.scale, rtol=0, atol=0)


def test_quantize_clamps_before_the_cast_and_handles_zero_rows() -> None:
    x = torch.zeros(4, 64)
    x[1] = 1e30  # amax / 448 then x / scale rounds to a hair above 448 in fp32 for some values
    x[2, 0] = -3.0
    data, scale = gs.quantize_fp8(x, rowwise=True)
    v = data.float() * scale
    assert bool(torch.isfinite(v).all())
    assert float(data.float().abs().max()) <= 448.0
    assert bool((data.float()[0] == 0).all()) and float(v[2, 0]) == -3.0


@pytest.mark.parametrize("precision", ["fp8-tensor", "fp8-rowwise"])
def test_fp8_stack_tracks_bf16(precision: str) -> None:
    shape = gs.shape_from_preset("tiny-dense")
    weights, cpu = gs.make_weights(shape, 2), torch.device("cpu")
    x = torch.randn(32, shape.hidden).to(torch.bfloat16)
    ref = gs.stack_forward(gs.build_stack(weights, "bf16", cpu), x, shape.q_width).float()
    low = gs.stack_forward(gs.build_stack(weights, precision, cpu), x, shape.q_width).float()
    rel = float((low - ref).norm() / ref.norm())
    assert 0 < rel < 0.1  # FP8 is different (not silently BF16) and close


def test_attention_stand_in_is_the_query_width_not_the_hidden_size() -> None:
    """o_proj reads q_heads * head_dim columns; Qwen3-8B has it equal to hidden, other shapes do not."""
    shape = gs.StackShape("wide-q", hidden=64, q_heads=4, kv_heads=2, head_dim=32, intermediate=96)
    assert shape.q_width == 128 != shape.hidden
    stack = gs.build_stack(gs.make_weights(shape, 1), "bf16", torch.device("cpu"))
    y = gs.stack_forward(stack, torch.randn(16, 64).to(torch.bfloat16), shape.q_width)
    assert y.shape == (16, 64) and bool(torch.isfinite(y).all())


def test_moe_preset_is_refused_naming_the_dense_ones() -> None:
    with pytest.raises(SystemExit, match="qwen3-8b"):
        gs.shape_from_preset("qwen3-30b-a3b")


def test_weights_are_drawn_once_in_bf16_on_the_cpu_and_shared_by_every_precision() -> None:
    shape = gs.shape_from_preset("tiny-dense")
    weights = gs.make_weights(shape, 2)
    assert all(
        w.dtype == torch.bfloat16 and w.device.type == "cpu" for layer in weights for w in layer.values()
    )
    assert torch.equal(gs.make_weights(shape, 2)[1]["o_proj"], weights[1]["o_proj"])  # seeded
    bf16 = gs.build_stack(weights, "bf16", torch.device("cpu"))
    fp8 = gs.build_stack(weights, "fp8-rowwise", torch.device("cpu"))
    assert torch.equal(bf16[0]["down_proj"].w, weights[0]["down_proj"])
    data, _ = gs.quantize_fp8(weights[0]["down_proj"], rowwise=True)
    assert torch.equal(fp8[0]["down_proj"].w_t.t().view(torch.uint8), data.view(torch.uint8))


# -- the CUDA call, checked by torch's own CUDA shape/layout rules on fake CUDA tensors ------------------------
@pytest.mark.parametrize("precision", ["fp8-tensor", "fp8-rowwise"])
@pytest.mark.parametrize("tokens", [512, 16384, 100])
def test_scaled_mm_arguments_pass_torchs_cuda_checks(precision: str, tokens: int) -> None:
    """On a CUDA device ``Linear`` takes the path CPU runs never take (per-tensor scales as 0-d tensors). Under
    FakeTensorMode a "cuda" tensor runs torch's CUDA checks of ``_scaled_mm`` (row-major mat1, column-major
    mat2, dims divisible by 16, scale shapes/dtypes for tensorwise and rowwise) without a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    shape = gs.shape_from_preset("qwen3-8b")
    with FakeTensorMode():
        cuda = torch.device("cuda")
        for name, (n, k) in shape.linears.items():
            lin = gs.Linear(torch.empty(n, k, dtype=torch.bfloat16, device=cuda), precision)
            if precision == "fp8-rowwise":
                assert lin.w_scale.shape == (1, n)
            else:
                assert lin.w_scale.dim() == 0
            y = lin(torch.empty(tokens, k, dtype=torch.bfloat16, device=cuda))
            assert (tuple(y.shape), y.dtype, y.device.type) == ((tokens, n), torch.bfloat16, "cuda"), name


def test_fake_cuda_checks_are_live_they_reject_a_k_not_divisible_by_16() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        cuda = torch.device("cuda")
        lin = gs.Linear(torch.empty(64, 40, dtype=torch.bfloat16, device=cuda), "fp8-rowwise")
        with pytest.raises(RuntimeError, match="divisible by 16"):
            lin(torch.empty(32, 40, dtype=torch.bfloat16, device=cuda))
        row_major_w = torch.empty(40 + 24, 64, dtype=torch.float8_e4m3fn, device=cuda)  # [K, N] row-major
        with pytest.raises(RuntimeError, match="col_major"):
            torch._scaled_mm(
                torch.empty(32, 64, dtype=torch.float8_e4m3fn, device=cuda),
                row_major_w,
                scale_a=torch.empty(32, 1, device=cuda),
                scale_b=torch.empty(1, 64, device=cuda),
                out_dtype=torch.bfloat16,
            )


# -- traces -----------------------------------------------------------------------------------------------
def test_traced_forwards_follow_a_discarded_profiler_warmup(tmp_path: Path) -> None:
    """The first forward under the profiler pays CUPTI/Kineto start-up (on CPU here it was ~4x the second);
    the schedule discards it, so the trace holds exactly TRACED_MICROBATCHES micro-batch ranges, in
    ProfilerStep#1.. (#0 was the warm-up)."""
    import gzip

    shape = gs.shape_from_preset("tiny-dense")
    gs.measure(shape, gs.make_weights(shape, 1), "bf16", 32, 1, 0, torch.device("cpu"), tmp_path)
    with gzip.open(tmp_path / "bf16-t32" / "rank-0.json.gz") as fh:
        trace = json.load(fh)
    names = [e.get("name", "") for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert names.count(gs.RANGE_NAME) == gs.TRACED_MICROBATCHES
    steps = sorted(n for n in names if n.startswith("ProfilerStep#"))
    assert steps == [f"ProfilerStep#{i + gs.PROFILER_WARMUP}" for i in range(gs.TRACED_MICROBATCHES)]


def test_traces_ingest_into_labelled_microbatches_the_fit_accepts(tmp_path: Path) -> None:
    """The documented chain: sweep traces -> ``mxperf ingest --microbatch-range`` (labels from each trace's
    sidecar) -> a micro-batch table per (precision, size) that ``mxperf fit`` can load and fit."""
    from mxperf.cli import main as mxperf_main
    from perfmodel.inputs import check_fittable, load_inputs

    out = tmp_path / "sweep"
    assert gs.main(["-o", str(out), *TINY]) == 0
    traces = sorted(str(p) for p in (out / "traces").glob("*/rank-0.json.gz"))
    assert len(traces) == 3 * 2
    ing = tmp_path / "ingest"
    assert mxperf_main(["ingest", *traces, "-o", str(ing), "--microbatch-range", gs.RANGE_NAME]) == 0
    mb = load_inputs([ing]).microbatches
    counts = mb.groupby(["precision", "tokens_per_microbatch"]).size().to_dict()
    assert counts == {(p, t): gs.TRACED_MICROBATCHES for p in gs.PRECISIONS for t in (32, 64)}
    assert set(mb["phase"]) == {gs.PHASE} and set(mb["model"]) == {"tiny-dense"}
    check_fittable(mb, "bf16")  # raises when a precision lacks a baseline or two sizes
    check_fittable(load_inputs([out]).microbatches, "bf16")


def test_cpu_run_writes_the_sweep_contract(tmp_path: Path) -> None:
    from tracing.outputs import store
    from tracing.outputs.schema import MICROBATCH_COLUMNS

    assert tuple(MICROBATCH_COLUMNS) == gs.MICROBATCH_COLUMNS
    out = tmp_path / "sweep"
    assert gs.main(["-o", str(out), *TINY]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "sweep" and manifest["status"] == "complete"
    df = store.read_table(out / "microbatches.parquet")
    assert list(df.columns) == list(MICROBATCH_COLUMNS)
    assert sorted(df["precision"].unique()) == ["bf16", "fp8-rowwise", "fp8-tensor"]
    assert len(df) == 3 * 2 * 2 and bool((df["seconds"] > 0).all())
    for prec in gs.PRECISIONS:
        d = out / "traces" / f"{prec}-t32"
        assert (d / "rank-0.json.gz").stat().st_size > 0
        assert f'precision = "{prec}"' in (d / "mxperf.toml").read_text()


def test_refuses_unknown_precision_and_cuda_without_a_device(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown precision"):
        gs.main(["-o", str(tmp_path / "a"), *TINY, "--precisions", "mxfp8"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device"):
            gs.main(["-o", str(tmp_path / "b"), "--device", "cuda"])


def test_shell_wrapper_runs_the_repo_with_pythonpath(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable, GPU_SWEEP_ARGS=" ".join([*TINY, "--no-trace"]))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu_sweep.sh"), str(tmp_path / "w")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == "complete"
