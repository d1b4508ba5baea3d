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
    from pipeline.mxfp8 import quantize_fp8_rowwise, quantize_fp8_tensor

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
    x = torch.randn(32, shape.hidden).to(torch.bfloat16)
    ref = gs.stack_forward(gs.build_stack(shape, 2, "bf16", torch.device("cpu")), x, shape.hidden).float()
    low = gs.stack_forward(gs.build_stack(shape, 2, precision, torch.device("cpu")), x, shape.hidden).float()
    rel = float((low - ref).norm() / ref.norm())
    assert 0 < rel < 0.1  # FP8 is different (not silently BF16) and close


def test_cpu_run_writes_the_sweep_contract(tmp_path: Path) -> None:
    from tracing import store
    from tracing.schema import MICROBATCH_COLUMNS

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
