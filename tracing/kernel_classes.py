"""GPU op classes by name pattern, so "time spent quantizing" or "time in NCCL" is one number.

Classes: ``communication``, ``attention``, ``gemm``, ``quantize`` (quantize / cast / transpose / amax / scale
kernels, the overhead low precision adds), ``elementwise``, ``other``; memcpy and memset ops are classed by
their kind. Rules are tried in order, first match wins: communication and attention come before GEMM (flash
attention kernels contain MMA loops), GEMM before quantize (an FP8 GEMM's name mentions e4m3 too).
Extend with :func:`with_rules` (your rules are tried first).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tracing import schema

CLASSES: tuple[str, ...] = (
    "communication",
    "attention",
    "gemm",
    "quantize",
    "elementwise",
    "other",
    "memcpy",
    "memset",
)

DEFAULT_RULES: tuple[tuple[str, str], ...] = (
    (
        "communication",
        r"nccl|ncclDevKernel|ncclKernel|all_?reduce|all_?gather|reduce_?scatter|alltoall|sendrecv|cross_device_reduce|\bmsccl|\brccl|nvshmem",
    ),
    (
        "attention",
        r"flash|fmha|attention|attn|sdpa|xformers|paged_?attention|mha_|flashinfer|efficient_attention",
    ),
    (
        "gemm",
        r"gemm|matmul|cublas|cutlass|nvjet|xmma|wgmma|hmma|\bmma|sm\d+_.*(tensorop|gemm)|ampere_|volta_|turing_|hopper_|_nn_|_nt_|_tn_|_tt_|splitkreduce|dot_?product|bmm",
    ),
    (
        "quantize",
        r"quantiz|dequant|cast|transpose|fp8|e4m3|e5m2|e8m0|mxfp|nvfp4|amax|scale|to_mx|float8|convert",
    ),
    (
        "elementwise",
        r"elementwise|vectorized|unrolled|pointwise|reduce_kernel|reduction|softmax|layer_?norm|rms_?norm|batch_?norm|bn_|dropout|relu|gelu|silu|swiglu|add|mul|copy|fill|index|gather|scatter|embedding|rotary|cat_|triton_poi|triton_red|triton_per",
    ),
)


@dataclass(frozen=True)
class KernelClassifier:
    rules: tuple[tuple[str, re.Pattern[str]], ...]

    def classify(self, name: str) -> str:
        for cls, pattern in self.rules:
            if pattern.search(name):
                return cls
        return "other"

    def classify_ops(self, kinds: pd.Series, names: pd.Series) -> np.ndarray:
        """Class per op: memcpy/memset by kind, kernels by name (each distinct name matched once)."""
        names = names.astype(str)
        lut = {n: self.classify(n) for n in pd.unique(names)}
        out = names.map(lut).to_numpy(dtype=object)
        kinds = kinds.astype(str).to_numpy()
        out[kinds == schema.MEMCPY] = "memcpy"
        out[kinds == schema.MEMSET] = "memset"
        return out


def _compile(rules: Iterable[tuple[str, str]]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((cls, re.compile(p, re.IGNORECASE)) for cls, p in rules)


DEFAULT = KernelClassifier(_compile(DEFAULT_RULES))


def with_rules(extra: Iterable[tuple[str, str]]) -> KernelClassifier:
    """A classifier whose ``extra`` (class, regex) rules are tried before the defaults."""
    return KernelClassifier(_compile(extra) + DEFAULT.rules)


def kernel_table(ops: pd.DataFrame, classifier: KernelClassifier = DEFAULT) -> pd.DataFrame:
    """One row per (device, kind, name): count, total/mean/max duration, class (``schema.KERNEL_COLUMNS``)."""
    cols = [c for c in schema.KERNEL_COLUMNS if c not in ("trace", "rank")]
    if len(ops) == 0:
        return schema.empty_frame({c: schema.KERNEL_COLUMNS[c] for c in cols})
    df = ops.loc[:, ["device", "kind", "name", "dur_ns"]].copy()
    df["kind"] = df["kind"].astype(str)
    df["name"] = df["name"].astype(str)
    g = df.groupby(["device", "kind", "name"], sort=True, observed=True)["dur_ns"]
    out = g.agg(count="count", total_ns="sum", mean_ns="mean", max_ns="max").reset_index()
    out["kernel_class"] = classifier.classify_ops(out["kind"], out["name"])
    out = out.sort_values(["device", "total_ns"], ascending=[True, False], kind="stable")
    return out.loc[:, cols].astype({c: schema.KERNEL_COLUMNS[c] for c in cols}).reset_index(drop=True)


def class_totals(kernels: pd.DataFrame) -> pd.DataFrame:
    """Total time per (device, class) from a kernel table, with the share of all GPU-op time."""
    t = kernels.groupby(["device", "kernel_class"], observed=True)["total_ns"].sum().reset_index()
    t["share"] = t["total_ns"] / t.groupby("device")["total_ns"].transform("sum")
    return t.sort_values(["device", "total_ns"], ascending=[True, False]).reset_index(drop=True)
