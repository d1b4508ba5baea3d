"""Weight sync: learner -> bytes -> sampler, with a fail-stop driver.

After each optimizer step the learner exports its **forward** weights in Hugging Face names and the sampler
loads them under a new version, across a serialization boundary (safetensors bytes, as between processes;
the sampler never shares tensor storage with the learner)::

    learner.export_weights(send_quantized) -> {HF name: tensor}          (uint8 bytes + scale, or BF16)
        -> pack_weights(tensors, version, grid)  -> bytes                 (metadata: version, grid, format)
        -> engine.update_weights(payload, version)                        (pause, drain, load, post-process,
                                                                           recalibrate, reset cache, commit)

What to send (:func:`send_quantized_for`). Quantized bytes travel only when they are the sampler's own grid:
learner ``mxfp8`` and sampler ``mxfp8`` (same TE rule), for linears that are on the sampler's grid. Every
other pairing sends BF16, and a quantizing sampler then quantizes online with its own rule -- "another grid",
the common case in verl / OpenRLHF / NeMo-RL (vLLM RFC #54477), and the source of I1 violations.

Fail-stop (:class:`WeightSync`): an export, pack or load error raises :class:`SyncError`; the engine's version
is not bumped and it serves nothing until a later sync succeeds (verl PR #7511 / TRL PR #5932 bumped the
version after a failed apply).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.interfaces import pack_weights, scale_name


class SyncError(RuntimeError):
    """A weight sync that failed or was partial; the sampler must not serve the new version."""


def send_quantized_for(learner_precision: str, sampler_mode: str, store: Any) -> Callable[[str], bool]:
    """The ``send_quantized(name)`` decision for a sampler whose store is ``store`` (a SamplerWeights)."""
    same_grid = learner_precision == "mxfp8" and sampler_mode == "mxfp8"
    dest_of = {p.source: store.dests[p.dest] for p in store.layout.pieces}

    def decide(name: str) -> bool:
        d = dest_of.get(name)
        return bool(same_grid and d is not None and d.quantized)

    return decide


def weights_of(engine: Any) -> Any:
    """The engine's SamplerWeights store (``engine.weights``), or None for an engine without one."""
    return getattr(engine, "weights", None)


@dataclass(frozen=True)
class SyncReport:
    """One sync: sizes and seconds per phase (export, pack, load = the engine's whole update_weights)."""

    version: int
    payload_bytes: int
    num_tensors: int
    num_quantized: int
    export_s: float
    pack_s: float
    load_s: float

    @property
    def total_s(self) -> float:
        return self.export_s + self.pack_s + self.load_s


class WeightSync:
    """Drives one sync per step. Subclass hooks (``export``, ``transform``) are where the fault injector
    corrupts a push, the way a broken transport or exporter would."""

    def __init__(self) -> None:
        self.last: SyncReport | None = None
        self.failures: list[str] = []

    def decide(self, learner: Any, engine: Any) -> Callable[[str], bool]:
        store = weights_of(engine)
        if store is None:
            return lambda name: False
        return send_quantized_for(learner.precision, engine.mode, store)

    def export(self, learner: Any, engine: Any) -> dict[str, torch.Tensor]:
        return learner.export_weights(self.decide(learner, engine))

    def transform(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Identity; the seam for payload faults (flipped byte, dropped tensor)."""
        return tensors

    def sync(self, learner: Any, engine: Any, version: int) -> SyncReport:
        """Export, pack and load weights as ``version``; raise SyncError (fail-stop) on any failure."""
        before = engine.weight_version
        if version <= before:
            raise SyncError(f"sync version {version} must be newer than the engine's {before}")
        t0 = time.perf_counter()
        tensors = self.transform(self.export(learner, engine))
        t1 = time.perf_counter()
        payload = pack_weights(tensors, version, grid=learner.precision)
        t2 = time.perf_counter()
        try:
            engine.update_weights(payload, version)
        except Exception as exc:
            self.failures.append(f"v{version}: {exc}")
            raise SyncError(
                f"weight sync to version {version} failed ({type(exc).__name__}: {exc}); "
                f"the sampler stays at version {engine.weight_version} and must not serve"
            ) from exc
        t3 = time.perf_counter()
        if engine.weight_version != version:
            raise SyncError(f"sampler reports version {engine.weight_version} after a sync to {version}")
        quantized = sum(1 for n, t in tensors.items() if t.dtype == torch.uint8 and scale_name(n) in tensors)
        self.last = SyncReport(version, len(payload), len(tensors), quantized, t1 - t0, t2 - t1, t3 - t2)
        return self.last
