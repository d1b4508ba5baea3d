"""MXFP8 quantize + dequantize throughput: mxperf (TE >= 2.13 rule) vs torchao 0.18 ``to_mx`` RCEIL, on one core.

    .venv/bin/python benchmarks/bench_quantize.py [--size 4096] [--repeats 15]

Workload: a [size, size] bfloat16 tensor -> MXFP8 (1x32 blocks along the last dim, E8M0 scales, E4M3 data)
-> back to bfloat16. The three contenders run round-robin in one process (so load changes on a shared machine
hit all of them alike) and each reports the median of ``--repeats`` timed runs after one warm-up:

- ``copy``: ``x.clone()``, the memory-bandwidth floor (reads and writes the bf16 bytes once);
- ``mxperf``: ``dequantize_mxfp8(quantize_mxfp8(x), torch.bfloat16)`` (eager PyTorch ops only);
- ``fused``: the GEMM-operand quantizer a GPU runs (``pipeline.quant.operands.quantize_grid``: one sync-free
  function per grid, ``torch.compile``-d there), eager here, and its dequantization -- same bytes as ``mxperf``
  (why a CPU uses ``mxperf``'s instead);
- ``torchao``: ``to_dtype(*to_mx(x, float8_e4m3fn, 32, RCEIL), bf16)`` from torchao 0.18.0 (``bench`` extra).

Throughput is counted in elements per second and as "GB/s" of the nominal traffic each path must move
(quantize: read 2 B + write 1 B per element; dequantize: read 1 B + write 2 B; copy: 2 + 2 B), scales ignored.
Also checks that torchao 0.18 and mxperf give the same bytes on this (bf16, random normal) input, as they should
(they differ only on fp32 just above 448 * 2^k, on blocks with amax <= 2.6e-36 and on NaN/Inf blocks).
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.quant import dequantize_mxfp8, quantize_mxfp8
from pipeline.quant.operands import Operand, dequantize_operand, quantize_grid
from tracing.outputs.manifest import cpu_name


def _torchao() -> tuple[str | None, Callable[[torch.Tensor], tuple] | None, Callable | None]:
    try:
        import torchao
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    except ImportError:
        return None, None, None

    def quantize(x: torch.Tensor) -> tuple:
        return to_mx(x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)

    def dequantize(q: tuple) -> torch.Tensor:
        scale, data = q
        return to_dtype(data, scale, torch.float8_e4m3fn, 32, torch.bfloat16)

    return torchao.__version__, quantize, dequantize


def _mxperf_q(x: torch.Tensor):
    return quantize_mxfp8(x)


def _mxperf_dq(q) -> torch.Tensor:
    return dequantize_mxfp8(q, torch.bfloat16)


def _fused_q(x: torch.Tensor) -> Operand:
    return Operand(*quantize_grid(x, "mx"), "mx", "mxfp8", "te")


def measure(contenders: dict[str, tuple[Callable, Callable | None]], x: torch.Tensor, repeats: int) -> dict:
    """Round-robin timing; returns {name: {"quantize_s": [..], "dequantize_s": [..]}}."""
    times: dict[str, dict[str, list[float]]] = {n: {"quantize_s": [], "dequantize_s": []} for n in contenders}
    for rep in range(repeats + 1):
        for name, (q_fn, dq_fn) in contenders.items():
            t0 = time.perf_counter()
            q = q_fn(x)
            t1 = time.perf_counter()
            if dq_fn is not None:
                dq_fn(q)
            t2 = time.perf_counter()
            del q
            if rep:  # the first round is the warm-up
                times[name]["quantize_s"].append(t1 - t0)
                times[name]["dequantize_s"].append(t2 - t1)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.size, args.size, dtype=torch.bfloat16)
    n = x.numel()

    ao_version, ao_q, ao_dq = _torchao()
    contenders: dict[str, tuple[Callable, Callable | None]] = {
        "copy": (lambda t: t.clone(), None),
        "mxperf": (_mxperf_q, _mxperf_dq),
        "fused": (_fused_q, lambda q: dequantize_operand(q, torch.bfloat16)),
    }
    op = _fused_q(x)
    ref = quantize_mxfp8(x)
    if not (torch.equal(op.data, ref.data) and torch.equal(op.scale, ref.scale)):
        raise SystemExit("the fused quantizer's bytes differ from quantize_mxfp8's")
    mismatches = None
    if ao_q is not None:
        contenders["torchao"] = (ao_q, ao_dq)
        ours = quantize_mxfp8(x)
        scale, data = ao_q(x)
        mismatches = {
            "scale_bytes": int((scale.view(torch.uint8) != ours.scale).sum()),
            "data_bytes": int((data.view(torch.uint8) != ours.data).sum()),
        }
    times = measure(contenders, x, args.repeats)

    rows = {}
    for name, t in times.items():
        q_s = statistics.median(t["quantize_s"])
        dq_s = statistics.median(t["dequantize_s"]) if name != "copy" else 0.0
        total = q_s + dq_s if name != "copy" else q_s
        nominal_bytes = 4 * n if name == "copy" else 6 * n
        rows[name] = {
            "quantize_ms": q_s * 1e3,
            "dequantize_ms": dq_s * 1e3,
            "total_ms": total * 1e3,
            "gelem_per_s": n / total / 1e9,
            "nominal_gb_per_s": nominal_bytes / total / 1e9,
        }
    ratio = rows["torchao"]["total_ms"] / rows["mxperf"]["total_ms"] if "torchao" in rows else None
    vs_copy = rows["mxperf"]["total_ms"] / rows["copy"]["total_ms"]

    print(f"MXFP8 quantize+dequantize, bf16 [{args.size}x{args.size}], 1 thread, median of {args.repeats}")
    print(f"{'path':<10}{'quant ms':>10}{'dequant ms':>12}{'total ms':>10}{'Gelem/s':>9}{'GB/s':>7}")
    op_ratio = rows["fused"]["total_ms"] / rows["mxperf"]["total_ms"]
    for name, r in rows.items():
        print(
            f"{name:<10}{r['quantize_ms']:>10.1f}{r['dequantize_ms']:>12.1f}{r['total_ms']:>10.1f}"
            f"{r['gelem_per_s']:>9.3f}{r['nominal_gb_per_s']:>7.2f}"
        )
    print(f"fused quantizer, eager: {op_ratio:.2f}x the time of mxperf's reference quantizer, same bytes")
    if ratio is not None:
        print(f"mxperf throughput = {ratio:.2f}x torchao {ao_version} RCEIL; {vs_copy:.1f}x the copy time")
        print(f"byte mismatches vs torchao {ao_version}: {mismatches}")
    else:
        print("torchao not installed (pip install -c constraints.txt torchao==0.18.0): no side-by-side ratio")
    result = {
        "schema_version": 1,
        "benchmark": "quantize_mxfp8",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "shape": [args.size, args.size],
        "dtype": "bfloat16",
        "threads": 1,
        "repeats": args.repeats,
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "torchao": ao_version,
        "results": rows,
        "speedup_vs_torchao": ratio,
        "time_vs_copy": vs_copy,
        "fused_eager_time_vs_mxperf": op_ratio,
        "mismatches_vs_torchao": mismatches,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
