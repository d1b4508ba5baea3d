"""Which precision did a trace's GEMMs run in? Read from the GEMM kernel names, with the evidence kept.

cuBLAS / CUTLASS / TE kernel names spell their operand types::

    nvjet_sm100_qqtst_128x256_..._Avec32UE8M0_Bvec32UE8M0_TNT       MXFP8 (32-element blocks, UE8M0 scales)
    cutlass3x_sm100_bstensorop_..._ue8m0xe4m3_...                   MXFP8 (block-scaled CUTLASS)
    sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_...  nvjet_sm90_qqtst   FP8 E4M3: per-tensor, delayed or rowwise --
                                                                      the name does not say which recipe
    nvjet_sm90_tst_...  sm90_xmma_gemm_bf16bf16_bf16f32_...           BF16

Rules (share = this family's GEMM time / all GEMM time): any MX block-scaled GEMM -> ``mxfp8`` (MXFP8 runs
keep some GEMMs, e.g. the LM head, in BF16); else any FP8 GEMM -> FP8 with an unknown scaling recipe, which
no precision id names alone (the caller asks for ``--label precision=``); else the family with the most
GEMM time: ``bf16`` only when the names say BF16 (``bf16``, nvjet ``t``); FP16, FP32 / TF32 (``sgemm``,
``s1688gemm``), FP4 and names that say nothing are reported and not mapped. No GEMM kernels (a CPU trace):
nothing detected.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from tracing.analysis.kernel_classes import kernel_table
from tracing.outputs import schema

# GEMM-class names that are not GEMMs (fbgemm_gpu's conversion / elementwise kernels contain "gemm")
_NOT_GEMM = re.compile(
    r"quantiz|dequant|cast|amax|transpose|to_mx|convert|_to_|elementwise|vectorized|reduce_kernel|qparam|permute"
    r"|offsets|bounds_check|embedding",
    re.IGNORECASE,
)
_FP4 = re.compile(r"ue4m3|vec16|e2m1|nvf4|mxf4|fp4", re.IGNORECASE)
_MX = re.compile(r"ue8m0|vec32|mxf8|mxfp8|mx_?fp8|block_?scaled|bstensorop|blockscaled", re.IGNORECASE)
_FP8 = re.compile(r"e4m3|e5m2|fp8|float8|f8f6f4|_qq[a-z]{2,}|qqtst|qqsss", re.IGNORECASE)
# cuBLAS nvjet kernels name the operand types by letter after "nvjet_[smXX_]": t bf16, h fp16, s fp32, q fp8
_BF16 = re.compile(r"bf16|bfloat16|nvjet_(?:sm\d+_)?t", re.IGNORECASE)
_FP16 = re.compile(r"f16|half|h884|h1688|h16816|nvjet_(?:sm\d+_)?h", re.IGNORECASE)
_FP32 = re.compile(r"sgemm|s1688|s16816|tf32|f32f32|nvjet_(?:sm\d+_)?s", re.IGNORECASE)


@dataclass(frozen=True)
class PrecisionEvidence:
    """What the GEMM kernels say: ``precision`` is a precision id, or None when they cannot name one."""

    precision: str | None
    family: str  # mxfp8 | fp8 | fp4 | bf16 | none
    gemm_ns: int  # all GEMM kernel time
    share: float  # share of GEMM time in the kernels of ``family``
    example: str  # the longest-running kernel of that family
    reason: str  # one line for people

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@functools.lru_cache(maxsize=65536)
def _is_gemm_name(name: str) -> bool:
    return _NOT_GEMM.search(name) is None


@functools.lru_cache(maxsize=65536)
def _family(name: str) -> str:
    for family, rx in (("fp4", _FP4), ("mxfp8", _MX), ("fp8", _FP8), ("bf16", _BF16), ("fp16", _FP16)):
        if rx.search(name):
            return family
    return "fp32" if _FP32.search(name) else "unknown"


def detect_precision(kernels: pd.DataFrame) -> PrecisionEvidence:
    """The precision of the GEMM kernels in a kernel table (``kernel_classes.kernel_table``: name,
    kernel_class, total_ns per kernel name), or of raw ``metrics.gpu_ops`` rows."""
    if "kernel_class" not in kernels:
        kernels = kernel_table(kernels)
    kernels = kernels[kernels["kind"].astype(str) == schema.KERNEL]
    if len(kernels) == 0:
        return PrecisionEvidence(None, "none", 0, 0.0, "", "no GPU kernels in the trace")
    names = kernels["name"].astype(str).to_numpy(object)
    is_gemm = (kernels["kernel_class"].astype(str) == "gemm").to_numpy(bool, copy=True)
    is_gemm &= np.array([_is_gemm_name(n) for n in names], bool)
    totals = pd.Series(kernels["total_ns"].to_numpy(np.int64), index=names)
    gemm = totals[is_gemm].groupby(level=0, sort=False).sum()  # a name on several devices: once
    if len(gemm) == 0 or int(gemm.sum()) == 0:
        return PrecisionEvidence(None, "none", 0, 0.0, "", "no GEMM kernels among the GPU kernels")
    fam = pd.Series([_family(n) for n in gemm.index], index=gemm.index)
    time_of = gemm.groupby(fam).sum()
    total = int(gemm.sum())
    low = [f for f in ("mxfp8", "fp8", "fp4") if f in time_of.index]  # any low-precision GEMM decides
    family = low[0] if low else str(time_of.idxmax())
    mine = gemm[fam == family]
    example = str(mine.idxmax())
    share = float(time_of[family]) / total
    pct = f"{100 * share:.0f} % of GEMM time"
    precision, reason = {
        "mxfp8": ("mxfp8", f"MX block-scaled GEMMs ({pct})"),
        "fp8": (None, f"FP8 GEMMs ({pct}); the kernel names do not say the scaling recipe"),
        "fp4": (None, f"FP4 GEMMs ({pct}); no mxperf precision id covers FP4"),
        "bf16": ("bf16", f"BF16 GEMMs ({pct}), none FP8 / MX"),
        "fp16": (None, f"FP16 GEMMs ({pct}); no mxperf precision id covers FP16"),
        "fp32": (None, f"FP32 / TF32 GEMMs ({pct}); no mxperf precision id covers them"),
        "unknown": (None, f"GEMM kernel names that do not say their operand types ({pct})"),
    }[family]
    return PrecisionEvidence(precision, family, total, share, example, reason)


def reconcile(label: str | None, evidence: PrecisionEvidence) -> tuple[str | None, str]:
    """(precision to use, warning or ""): the label wins; a label the kernels contradict gets a warning
    naming both (``mxfp8*`` labels expect MX kernels, ``fp8-*`` FP8 ones, ``bf16`` BF16 ones)."""
    if label is None:
        return evidence.precision, ""
    if evidence.family in ("none", "unknown"):
        return label, ""
    expected = "mxfp8" if label.startswith("mxfp8") else "fp8" if label.startswith("fp8") else label
    if expected == evidence.family:
        return label, ""
    seen = evidence.precision or evidence.family
    return label, (
        f"label precision={label} but the GEMM kernels look {seen} ({evidence.reason}; e.g. {evidence.example})"
    )
