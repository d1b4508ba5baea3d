"""Which machine made an output and whether its low precision was real or emulated, from its manifest.

Pure functions over a manifest mapping (no files, no Streamlit). The rule the dashboard must never break: a
CPU result with emulated MXFP8 must not read like a GPU result, and an ingested A100/H100 trace shows the
GPU that made it (``traces[].gpu_names``, recorded by ingest), never the machine that ingested it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

BASELINE_IDS = frozenset({"bf16", "fp32", "fp16"})
# Hardware with native MX (E8M0-scaled) GEMMs; anything else runs MXFP8 through an emulation.
_MX_NATIVE = ("B100", "B200", "B300", "GB200", "GB300", "RTX 50", "RTX PRO 6000 Blackwell")
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class Provenance:
    """``device``: what ran it (``CPU``, ``NVIDIA H100 80GB HBM3 (cuda:0)``, ``2 x NVIDIA A100 (trace)``);
    ``low_precision``: ``emulated`` | ``native`` | ``n/a`` (baseline only, or a trace) | ``not recorded``;
    ``note``: one sentence a card shows under its title."""

    device: str
    low_precision: str
    note: str

    @property
    def badge(self) -> str:
        lp = "" if self.low_precision == "n/a" else f" · low precision {self.low_precision}"
        return f"{self.device}{lp}"


def _gpu_names(manifest: Mapping[str, Any]) -> list[str]:
    names: list[str] = []
    for trace in manifest.get("traces") or []:
        if isinstance(trace, Mapping):
            names += [str(n) for n in trace.get("gpu_names") or [] if n]
    return names


def _num_trace_devices(manifest: Mapping[str, Any]) -> int:
    return sum(len(t.get("devices") or []) for t in manifest.get("traces") or [] if isinstance(t, Mapping))


def _low_ids(precisions: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(p for p in precisions if p and p not in BASELINE_IDS))


def _count(names: list[str]) -> str:
    uniq = sorted(set(names))
    return ", ".join(f"{names.count(n)} x {n}" if names.count(n) > 1 else n for n in uniq)


def _ingest(manifest: Mapping[str, Any]) -> Provenance:
    traces = [t for t in manifest.get("traces") or [] if isinstance(t, Mapping)]
    if traces and all(t.get("format") == "metric_log" for t in traces):
        frameworks = sorted({str(t.get("framework") or "?") for t in traces})
        return Provenance(
            f"{'/'.join(frameworks)} metric log (device not recorded)",
            NOT_RECORDED,
            "Per-step timers and mismatch metrics from the framework's own log: no trace, so no device, "
            "GPU busy or host stall, and whether low precision was native is not recorded.",
        )
    names = _gpu_names(manifest)
    devices = _num_trace_devices(manifest)
    if names:
        return Provenance(
            f"{_count(names)} (from the trace)",
            "n/a",
            f"Traced on {_count(names)}; the machine that ingested it does not matter.",
        )
    if devices:
        return Provenance(
            f"{devices} GPU(s), name not in the trace",
            "n/a",
            "The trace has GPU ops but does not name the GPU (no deviceProperties / TARGET_INFO_GPU).",
        )
    if manifest.get("traces") is None:
        return Provenance(NOT_RECORDED, "n/a", "This ingest manifest does not list its traces.")
    return Provenance(
        "CPU-only trace", "n/a", "No GPU ops in the trace: GPU busy and host stall do not exist for it."
    )


def _gemm_backends(manifest: Mapping[str, Any], low: list[str]) -> dict[str, str]:
    """Low precision -> GEMM backend as the run recorded it (``engines.learner`` of a run, ``learners`` of a
    sweep: ``emulated`` | ``scaled_mm`` | ...); empty when not recorded (older outputs)."""
    out: dict[str, str] = {}
    engines = manifest.get("engines")
    learner = engines.get("learner") if isinstance(engines, Mapping) else None
    if isinstance(learner, Mapping) and learner.get("gemm_backend") and learner.get("precision") in low:
        out[str(learner["precision"])] = str(learner["gemm_backend"])
    learners = manifest.get("learners")
    if isinstance(learners, Mapping):
        for prec, info in learners.items():
            if prec in low and isinstance(info, Mapping) and info.get("gemm_backend"):
                out[str(prec)] = str(info["gemm_backend"])
    if isinstance(manifest.get("emulated"), bool):  # a producer that says it in one flag
        out.update({p: "emulated" if manifest["emulated"] else "native" for p in low if p not in out})
    return out


def _run(manifest: Mapping[str, Any], precisions: list[str]) -> Provenance:
    config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
    machine = manifest.get("machine") if isinstance(manifest.get("machine"), Mapping) else {}
    learner_dev = manifest.get("learner_device") or config.get("learner_device") or config.get("device")
    gpu = machine.get("gpu")
    low = _low_ids(precisions)
    on_gpu = isinstance(learner_dev, str) and learner_dev.startswith("cuda")
    if on_gpu:
        device = f"{gpu or 'CUDA GPU'} ({learner_dev})"
    elif learner_dev == "cpu" or not gpu:
        device = "CPU" + (f" ({machine.get('cpu')})" if machine.get("cpu") else "")
    else:
        device = f"{NOT_RECORDED} (machine has {gpu}; learner device not in the manifest)"
    backends = _gemm_backends(manifest, low)
    if not low:
        state, note = "n/a", f"Baseline precision only, on {device}."
    elif backends:
        kinds = sorted({"emulated" if b == "emulated" else "native" for b in backends.values()})
        state = "/".join(kinds)
        said = ", ".join(
            f"{p}: {'emulated (exact bytes)' if b == 'emulated' else f'native GEMMs ({b})'}"
            for p, b in backends.items()
        )
        note = f"On {device}, recorded by the run: {said}."
        if "emulated" in kinds:
            note += " Emulated costs are not what the format costs with hardware GEMMs."
    elif not on_gpu and (learner_dev == "cpu" or not gpu):
        state = "emulated"
        note = (
            f"CPU run: {', '.join(low)} is emulated (quantize/dequantize around higher-precision GEMMs), so "
            "its costs are the emulation's on this CPU, not what it costs on a GPU."
        )
    elif on_gpu and any(p.startswith("mxfp8") for p in low) and not any(m in str(gpu) for m in _MX_NATIVE):
        state = "emulated"
        note = f"{gpu} has no native MXFP8 GEMMs: mxfp8 here is an emulation."
    else:
        state = NOT_RECORDED
        note = f"{', '.join(low)} on {device}: whether GEMMs were native or emulated is not recorded."
    sampler_dev = manifest.get("sampler_device") or config.get("sampler_device")
    if sampler_dev and sampler_dev != learner_dev:
        note += f" Sampler on {sampler_dev}."
    return Provenance(device, state, note)


def provenance(manifest: Mapping[str, Any], precisions: Iterable[str] = ()) -> Provenance:
    """Device and emulation of one output (run, sweep, consistency, faults, ingest). Fits take their
    inputs' provenance (:func:`combine`)."""
    if manifest.get("kind") == "ingest":
        return _ingest(manifest)
    return _run(manifest, list(precisions))


def combine(parts: Iterable[Provenance]) -> Provenance:
    """One label for an output built from others (a fit over a sweep and a run)."""
    parts = list(parts)
    if not parts:
        return Provenance(NOT_RECORDED, NOT_RECORDED, "Its inputs are not under the runs directory.")
    devices = sorted({p.device for p in parts})
    states = sorted({p.low_precision for p in parts} - {"n/a"}) or ["n/a"]
    notes = " ".join(dict.fromkeys(p.note for p in parts))
    return Provenance(" + ".join(devices), "/".join(states), notes)
