"""Settings every experiment config shares (model, seed, warm start, compute dtype, device, GEMMs) and the checks
they run in ``__post_init__``, so that a bad value is one ``InputError`` naming the flag before any work starts.

``RunConfig``, ``SweepConfig``, ``ConsistencyConfig`` and ``FaultRunSettings`` all derive from
:class:`ExperimentSettings`; the checks below are the only place their common rules live.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.model.presets import get_preset, require_trainable
from tracing.outputs.errors import InputError

COMPUTE_DTYPES = ("bfloat16", "float32")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def at_least(minimum: int, **values: Any) -> None:
    """Each value an int >= ``minimum`` and at most ``2**62`` (a seed, a count torch and NumPy take as a
    64-bit integer), InputError naming the flag otherwise."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise InputError(f"{_flag(name)} must be an integer >= {minimum}, got {v!r}")
        if v > 2**62:
            raise InputError(f"{_flag(name)} must be at most 2^62, got {v!r}")


def positive(**values: Any) -> None:
    """Each value a finite number > 0."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise InputError(f"{_flag(name)} must be a finite number > 0, got {v!r}")


def int_range(name: str, text: str) -> tuple[int, int]:
    """``N`` or ``LO:HI`` (integers >= 1, LO <= HI) as ``(lo, hi)``; ``N`` is ``(N, N)``."""
    parts = str(text).strip().split(":")
    shape = f"{_flag(name)} must be N or LO:HI (integers >= 1), got {text!r}"
    if len(parts) > 2:
        raise InputError(shape)
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise InputError(shape) from None
    lo, hi = values[0], values[-1]
    if min(lo, hi) < 1:
        raise InputError(shape)
    if lo > hi:
        raise InputError(f"{_flag(name)} {text}: LO {lo} is above HI {hi} (write LO:HI with LO <= HI)")
    return lo, hi


def one_of(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InputError(f"unknown {_flag(name)} {value!r}; choose one of {', '.join(choices)}")


@dataclass(frozen=True)
class ExperimentSettings:
    """What every experiment needs: the model preset, the seed, the supervised warm start, the learner's
    autocast dtype, the device (``cpu``, ``cuda``, ``cuda:N``; ``auto`` picks CUDA when present), how the
    quantized GEMMs run (``gemm``: auto | emulated | scaled_mm) and when weights are cast (``weight_cast``)."""

    model: str = "tiny-dense"
    seed: int = 0
    pretrain_steps: int = 0
    compute_dtype: str = "bfloat16"
    device: str = "cpu"
    gemm: str = "auto"
    weight_cast: str = "per-step"

    def __post_init__(self) -> None:
        from pipeline.device import resolve_device
        from pipeline.quant.gemm import GEMM_CHOICES
        from pipeline.quant.linear import WEIGHT_CASTS

        require_trainable(get_preset(self.model))  # InputError on an unknown or shape-only id
        at_least(0, seed=self.seed, pretrain_steps=self.pretrain_steps)
        one_of("compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
        one_of("gemm", self.gemm, GEMM_CHOICES)
        one_of("weight_cast", self.weight_cast, WEIGHT_CASTS)
        resolve_device(self.device)  # DeviceUnavailableError: the machine lacks it

    def check_gemm(self, precisions: tuple[str, ...]) -> None:
        """``--gemm scaled_mm`` only where the device has the kernel for every learner precision asked for."""
        from pipeline.device import HardwareUnavailableError
        from pipeline.quant.gemm import choose_backend

        if self.gemm != "scaled_mm":
            return
        for p in precisions:
            try:
                choose_backend(p, self.torch_device, self.gemm)
            except HardwareUnavailableError as exc:
                raise InputError(str(exc)) from None

    @property
    def torch_device(self) -> Any:
        from pipeline.device import resolve_device

        return resolve_device(self.device)

    def learner_options(self) -> dict[str, Any]:
        """Keyword arguments of ``HFLearner`` that these settings fix."""
        return {
            "compute_dtype": self.compute_dtype,
            "device": self.torch_device,
            "gemm": self.gemm,
            "weight_cast": self.weight_cast,
        }
