"""I1 for the weight-only-grid vLLM sampler (CPU, mode ``mxfp8``): BF16 weights that are exactly the learner's
dequantized MXFP8 bytes.

vLLM's CPU build has no FP8 GEMM, so an "MXFP8 sampler" there holds the learner's grid as values: for each
linear the learner quantizes, the sampler tensor must equal, bit for bit, ``dequantize(learner fprop bytes,
E8M0 scales)`` in BF16 (exact: an E4M3 value times a power of two fits BF16). Every other tensor is the BF16
value, as in BF16 mode. ``check_weight_only_grid`` builds that expectation independently of the push path
(the learner's export, fused by the canonical sampler layout) and compares with ``engine.read_back()``.

Zeros: MXFP8 has -0 (byte 0x80) and quantizes small weights to it; the identity read-back computes
1 * (-0) + 0 * w = +0, so the kernel's view cannot carry the sign of a zero weight (nor does it matter to any
product). Values are therefore compared as numbers (-0 == +0); every other value bit for bit.

``check_sync_vllm`` is a drop-in ``checker`` for ``pipeline.experiments.loop.RLLoop``: ``pipeline.sync.invariants.check_sync``
with I1 replaced by this comparison when the engine's ``weight_grid`` is ``"weight-only"``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pipeline.engines.vllm.client import dequantize_payload


def expected_weight_only_grid(learner: Any, layout: Any) -> dict[str, torch.Tensor]:
    """Sampler-named BF16 tensors: the learner's quantized linears dequantized, the rest its BF16 values."""
    values, _ = dequantize_payload(dict(learner.export_weights(lambda name: True)))
    out: dict[str, torch.Tensor] = {}
    for d in layout.dests.values():
        t = torch.empty(d.shape, dtype=torch.bfloat16)
        for p in (p for p in layout.pieces if p.dest == d.name):
            t[p.dst_index()] = values[p.source][p.src_index()].reshape(t[p.dst_index()].shape)
        out[d.name] = t
    return out


def check_weight_only_grid(
    actual: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> list[tuple[str, str]]:
    failures = []
    for name, want in expected.items():
        got = actual.get(name)
        if got is None:
            failures.append((name, "missing from the engine"))
        elif got.shape != want.shape or got.dtype != want.dtype:
            failures.append(
                (name, f"{tuple(got.shape)} {got.dtype} != expected {tuple(want.shape)} {want.dtype}")
            )
        elif not torch.equal(got, want):  # value equality: -0.0 == +0.0 (see below), bits otherwise
            n = int((got != want).sum())
            failures.append((name, f"{n} of {want.numel()} values are not the learner's MXFP8 grid points"))
    return failures


def check_sync_vllm(
    step: int, learner: Any, engine: Any, *, rollouts: Sequence[Any] = (), report: Any = None
) -> list[Any]:
    """``check_sync`` with I1 = weight-only-grid identity for a weight-only-grid engine."""
    from pipeline.sync.invariants import check_sync

    rows = check_sync(step, learner, engine, rollouts=rollouts, report=report)
    if getattr(engine, "weight_grid", "bf16") != "weight-only":
        return rows
    t0 = time.perf_counter()
    failures = check_weight_only_grid(
        engine.read_back(), expected_weight_only_grid(learner, engine.weights.layout)
    )
    out = []
    for r in rows:
        if r.invariant == "I1":
            n = len(engine.weights.layout.dests)
            r = dataclasses.replace(
                r,
                passed=not failures,
                first_failing_tensor=failures[0][0] if failures else None,
                detail=(
                    f"{n} tensors are the learner's MXFP8 grid (weight-only)"
                    if not failures
                    else f"{len(failures)} failing; " + "; ".join(f"{a}: {b}" for a, b in failures[:3])
                ),
                check_seconds=time.perf_counter() - t0,
            )
        out.append(r)
    return out


def make_vllm_weight_sync() -> Any:
    """A ``WeightSync`` for vLLM engines (``RLLoop(syncer=...)``): to a weight-only-grid engine an MXFP8
    learner sends the bytes + scales of every tensor it quantizes (the client dequantizes them exactly);
    otherwise the default decision (BF16)."""
    from pipeline.sync.weight_sync import WeightSync

    class VllmWeightSync(WeightSync):
        def decide(self, learner: Any, engine: Any) -> Any:
            if getattr(engine, "weight_grid", None) == "weight-only" and learner.precision == "mxfp8":
                return lambda name: True
            return super().decide(learner, engine)

    return VllmWeightSync()
