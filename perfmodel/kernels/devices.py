"""Peak dense GEMM throughput and HBM bandwidth per device, from ``devices.toml`` (every figure with its source).

:func:`device` finds a device by id or alias (``b200``, ``H100 SXM``, a trace's device name);
:meth:`Device.peak_flops` gives the peak for a GEMM precision family (``tracing.analysis.precision``) and the
note that goes with it, or None and why: a figure never guessed.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tracing.outputs.errors import InputError

DEVICES_PATH = Path(__file__).with_name("devices.toml")
FIGURES = ("bf16", "fp8", "mxfp8", "fp4", "mxfp4")
# the family a kernel name states -> the table's figure (fp16 runs at the bf16 rate on these tensor cores)
FAMILY_FIGURE = {
    "bf16": "bf16",
    "fp16": "bf16",
    "fp8": "fp8",
    "mxfp8": "mxfp8",
    "fp4": "fp4",
    "mxfp4": "mxfp4",
}


@dataclass(frozen=True)
class Figure:
    value: float | None  # FLOP/s or bytes/s; None when no source states it
    source: str
    note: str


@dataclass(frozen=True)
class Device:
    id: str
    name: str
    aliases: tuple[str, ...]
    mx_tensor_cores: bool
    mx_note: str
    figures: dict[str, Figure] = field(default_factory=dict)  # FIGURES + "hbm"

    @property
    def hbm_bytes_per_s(self) -> float | None:
        return self.figures["hbm"].value

    def peak_flops(self, family: str) -> tuple[float | None, str]:
        """(peak dense FLOP/s, note) for a GEMM of precision ``family``; (None, why) when there is none."""
        fig = FAMILY_FIGURE.get(family)
        if fig is None:
            return None, f"no {self.id} peak for {family} GEMMs in devices.toml"
        if fig in ("mxfp8", "mxfp4"):
            if not self.mx_tensor_cores:
                return None, f"{self.id}: {self.mx_note}"
            own = self.figures[fig]
            if own.value is not None:
                return own.value, own.note
            base = self.figures[fig[2:]]
            if base.value is None:
                return None, f"{self.id}: no {fig} nor {fig[2:]} figure ({base.note or own.note})"
            return (
                base.value,
                f"the {fig[2:].upper()} figure: the source lists no separate {fig.upper()} rate",
            )
        f = self.figures[fig]
        return f.value, f.note


def _figure(raw: dict[str, object], key: str, scale: float) -> Figure:
    value = raw.get(f"{key}_tflops" if key != "hbm" else "hbm_tbps")
    source = str(raw.get(f"{key}_source", ""))
    note = str(raw.get(f"{key}_note", ""))
    if value is not None and not source:
        raise ValueError(f"devices.toml: {raw.get('id')}: {key} has a figure but no source")
    return Figure(float(value) * scale if value is not None else None, source, note)


@lru_cache(maxsize=4)
def load_devices(path: str | Path = DEVICES_PATH) -> tuple[Device, ...]:
    data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    out = []
    for raw in data.get("device", []):
        figures = {k: _figure(raw, k, 1e12) for k in FIGURES}
        figures["hbm"] = _figure(raw, "hbm", 1e12)
        out.append(
            Device(
                id=str(raw["id"]),
                name=str(raw["name"]),
                aliases=tuple(str(a).lower() for a in raw.get("aliases", [])),
                mx_tensor_cores=bool(raw.get("mx_tensor_cores", False)),
                mx_note=str(raw.get("mx_note", "")),
                figures=figures,
            )
        )
    return tuple(out)


def device(name: str) -> Device:
    """The device whose id, name or alias is ``name`` (case-insensitive); an :class:`InputError` naming the
    known ids otherwise."""
    key = name.strip().lower()
    for d in load_devices():
        if key in (d.id, d.name.lower(), *d.aliases):
            return d
    known = ", ".join(d.id for d in load_devices())
    raise InputError(f"--device {name!r}: not in perfmodel/kernels/devices.toml (known: {known})")
