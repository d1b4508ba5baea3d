"""Which hardware each input's timings come from, and a warning when a step adds phase times measured on other
(or unrecorded) hardware to micro-batch fits: the step model assumes one machine (issue 33 item 1)."""

from __future__ import annotations

from collections.abc import Mapping


def hardware_of(manifest: dict, kind: str) -> str | None:
    """The device an input's timings were measured on: a GPU's name, ``CPU``, or None when the input does not
    record it (a metric log, a trace naming no device)."""
    machine = manifest.get("machine") or {}
    if kind in ("run", "sweep"):
        device = str(
            manifest.get("learner_device") or (manifest.get("config") or {}).get("learner_device") or ""
        )
        if device.startswith("cpu") or not machine.get("gpu"):
            return "CPU"
        return str(machine["gpu"])
    traces = manifest.get("traces") or []
    timed = [t for t in traces if isinstance(t, dict) and t.get("format") != "metric_log"]
    names = sorted({str(n) for t in timed for n in t.get("gpu_names") or []})
    if names:
        return ", ".join(names)
    if timed and not any(t.get("devices") for t in timed):
        return "CPU"
    return None


def hardware_warning(microbatches: Mapping[str, str | None], phases: Mapping[str, str | None]) -> str | None:
    """One sentence when phase sources ran on hardware other than the micro-batch inputs' (or do not say
    which), None when every known device agrees or the micro-batch inputs' device is unknown."""
    fit_hw = sorted({h for h in microbatches.values() if h})
    if not fit_hw:
        return None
    other = sorted(p for p, h in phases.items() if h and h not in fit_hw)
    unknown = sorted(p for p, h in phases.items() if not h)
    parts = []
    if other:
        parts.append(", ".join(f"{p} ran on {phases[p]}" for p in other))
    if unknown:
        parts.append(f"{', '.join(unknown)} do not record their hardware (metric logs)")
    if not parts:
        return None
    return (
        f"the micro-batch fits were measured on {' and '.join(fit_hw)}, but the phase times of "
        f"{'; '.join(parts)}: the step adds them as if measured on one machine; use phase sources from the "
        "fits' hardware (or --phase) for a step answer you can trust"
    )
