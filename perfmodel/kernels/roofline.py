"""Physical bounds of the GEMMs of a trace: FLOPs and bytes from the recorded shapes, achieved FLOP/s, the
fraction of the device's peak, and whether the roofline calls the GEMM compute- or memory-bound.

Shapes are those of the op that launched the GEMM kernel (``perfmodel.kernels.ops``):

    aten::linear(x [..., K], w [N, K], bias)   M = prod(x[:-1])      aten::mm(a [M, K], b [K, N])
    aten::addmm(bias, a [M, K], b [K, N])      aten::bmm(a [B, M, K], b [B, K, N])  (baddbmm: bias first)
    aten::matmul(a [..., M, K], b [K, N] | [..., K, N])                aten::_scaled_mm(a [M, K], b [K, N])

FLOPs = 2 * B * M * N * K. Bytes = the smallest traffic the kernel can have: each operand read once and the
output written once, at the operand precision the kernel's name states (``tracing.analysis.precision``):
bf16 / fp16 2 bytes; fp8 1 byte; MX formats 1 (mxfp8) or 0.5 (mxfp4) byte plus one E8M0 scale byte per 32
elements; fp32 4; the output in bf16 (2 bytes) for 8- and 4-bit GEMMs, else in the operand precision; a bias
read once. The ridge point of a device is peak / bandwidth (FLOP per byte): a GEMM whose intensity
(FLOPs / bytes) is above it is compute-bound, else memory-bound; its floor time is max(FLOPs / peak,
bytes / bandwidth).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from perfmodel.kernels.devices import Device

OPERAND_BYTES = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp32": 4.0,
    "fp64": 8.0,
    "fp8": 1.0,
    "int8": 1.0,
    "mxfp8": 1.0 + 1.0 / 32,
    "fp4": 0.5,
    "mxfp4": 0.5 + 1.0 / 32,
}
OUTPUT_BYTES = {"fp8": 2.0, "int8": 4.0, "mxfp8": 2.0, "fp4": 2.0, "mxfp4": 2.0}


@dataclass(frozen=True)
class Gemm:
    batch: int
    m: int
    n: int
    k: int
    bias: int = 0  # elements of a bias read once (0: none)

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    def bytes(self, family: str) -> float | None:
        op = OPERAND_BYTES.get(family)
        if op is None:
            return None
        out = OUTPUT_BYTES.get(family, op)
        a = self.batch * self.m * self.k
        b = self.batch * self.k * self.n
        c = self.batch * self.m * self.n
        return (a + b) * op + c * out + self.bias * (out if family in OUTPUT_BYTES else op)


def _prod(dims: tuple[int, ...] | list[int]) -> int:
    return math.prod(dims) if dims else 1


def gemm_dims(op: str, shapes: str | list[list[int]]) -> Gemm | None:
    """M, N, K, batch (and bias) of a GEMM op from its recorded input shapes; None when they do not say."""
    try:
        args = json.loads(shapes) if isinstance(shapes, str) else shapes
    except ValueError:
        return None
    if not isinstance(args, list):
        return None
    dims = [tuple(a) if isinstance(a, list) and all(type(d) is int for d in a) else () for a in args]
    name = op.split(",")[0].strip()
    try:
        if name == "aten::linear":
            x, w = dims[0], dims[1]
            if len(x) < 1 or len(w) != 2 or x[-1] != w[1]:
                return None
            bias = _prod(dims[2]) if len(dims) > 2 and dims[2] else 0
            return Gemm(1, _prod(x[:-1]), w[0], w[1], bias)
        if name in ("aten::mm", "aten::_scaled_mm"):
            a, b = dims[0], dims[1]
            if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
                return None
            return Gemm(1, a[0], b[1], a[1])
        if name == "aten::addmm":
            c, a, b = dims[0], dims[1], dims[2]
            if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
                return None
            return Gemm(1, a[0], b[1], a[1], _prod(c) if c else 0)
        if name in ("aten::bmm", "aten::baddbmm"):
            off = 1 if name == "aten::baddbmm" else 0
            a, b = dims[off], dims[off + 1]
            if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[2] != b[1]:
                return None
            return Gemm(a[0], a[1], b[2], a[2], _prod(dims[0]) if off and dims[0] else 0)
        if name == "aten::matmul":
            a, b = dims[0], dims[1]
            if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
                return None
            if len(b) == 2:
                return Gemm(1, _prod(a[:-1]), b[1], a[-1])
            batch = max(_prod(a[:-2]), _prod(b[:-2]))
            return Gemm(batch, a[-2], b[-1], a[-1])
    except IndexError:
        return None
    return None


def bound(gemm: Gemm, family: str, dur_ns: float, dev: Device | None) -> dict[str, Any]:
    """FLOPs, bytes, achieved FLOP/s and, with a device, fraction of peak, bound and floor time of one GEMM."""
    flops = gemm.flops
    nbytes = gemm.bytes(family)
    row: dict[str, Any] = {
        "flops": flops,
        "bytes": nbytes,
        "intensity": flops / nbytes if nbytes else None,
        "achieved_flops": flops / (dur_ns * 1e-9) if dur_ns > 0 else None,
        "peak_flops": None,
        "fraction_of_peak": None,
        "bound": None,
        "floor_ns": None,
        "peak_note": "",
    }
    if dev is None:
        return row
    peak, note = dev.peak_flops(family)
    bw = dev.hbm_bytes_per_s
    row["peak_flops"] = peak
    row["peak_note"] = note
    if peak and row["achieved_flops"] is not None:
        row["fraction_of_peak"] = row["achieved_flops"] / peak
    if peak and bw and nbytes:
        row["bound"] = "compute" if flops / nbytes >= peak / bw else "memory"
        row["floor_ns"] = max(flops / peak, nbytes / bw) * 1e9
    return row


def gemm_table(con: Any, dev: Device | None, *, top: int = 0) -> list[dict[str, Any]]:
    """One row per (GEMM kernel, launching op, shapes) of ``perfmodel.kernels.ops``' ``ops``: count, mean time
    and :func:`bound` at the mean, heaviest first."""
    from tracing.analysis.precision import gemm_precision

    limit = f"limit {int(top)}" if top else ""
    rows = con.execute(
        f"""
        select name, gemm_op, shapes, count(*) as n, sum(dur_ns)::bigint as total_ns
        from ops where kernel_class = 'gemm' and shapes is not null
        group by all order by total_ns desc, name, shapes {limit}
        """
    ).fetchall()
    out = []
    for name, op, shapes, n, total in rows:
        g = gemm_dims(op, shapes)
        family = gemm_precision(name)
        row: dict[str, Any] = {
            "kernel": name,
            "op": op,
            "shapes": shapes,
            "precision": family,
            "count": int(n),
            "total_ns": int(total),
            "mean_ns": int(total) / int(n),
        }
        if g is None:
            row["note"] = "shapes do not give M, N, K"
        else:
            row.update({"batch": g.batch, "m": g.m, "n": g.n, "k": g.k})
            row.update(bound(g, family, row["mean_ns"], dev))
        out.append(row)
    return out
