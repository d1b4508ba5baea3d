"""Devices: ``--device auto|cpu|cuda[:N]`` resolved once, capability checks for the GPU-only paths, and lazy
imports of the optional GPU extras, each failing with one line naming what is missing.

Transformer Engine is an optional extra (``pip install 'mxperf[gpu]'`` on a CUDA machine). It is never imported at
module level anywhere in mxperf: the CPU install neither has nor needs it (on this kind of machine
``transformer_engine`` cannot even be imported, and installing it breaks ``import megatron.core``).

Which hardware runs which real low-precision GEMM (``pipeline.quant.gemm``; everything else is emulated with
the exact bytes, and each run records which one it used):

================  =========================  ================================================================
id                needs                      kernel
================  =========================  ================================================================
``fp8-tensor``    SM 8.9+ (Ada, Hopper, ..)  ``torch._scaled_mm``, one fp32 scale per operand
``fp8-rowwise``   SM 9.0+                    ``torch._scaled_mm``, fp32 scales [M, 1] and [1, N]
``fp8-block128``  SM 9.0 (Hopper only),      ``torch._scaled_mm`` 1x128 x 128x128 fp32 block scales
                  CUDA >= 12.9
``mxfp8``         SM 10.x (Blackwell)        ``torch._scaled_mm`` with swizzled E8M0 scales (1x32 blocks),
                                             or TE ``MXFP8BlockScaling`` in the Megatron learner
================  =========================  ================================================================
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

from tracing.outputs.errors import InputError

DEVICE_CHOICES = "auto | cpu | cuda | cuda:N"
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(?::(\d+))?)$")


class HardwareUnavailableError(RuntimeError):
    """A GPU path was asked for on a machine (or install) that cannot run it."""


class DeviceUnavailableError(InputError):
    """``--device`` names a device this machine does not have (one line, exit 2)."""


def cuda_capability(index: int = 0) -> tuple[int, int] | None:
    """(major, minor) of CUDA device ``index``, or None without a usable CUDA device."""
    import torch

    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    return tuple(torch.cuda.get_device_capability(index))  # type: ignore[return-value]


def describe_device(index: int = 0) -> str:
    import torch

    cap = cuda_capability(index)
    if cap is None:
        return f"no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda})"
    name = torch.cuda.get_device_name(index)
    return f"{name} (SM {cap[0]}.{cap[1]}, torch {torch.__version__}, CUDA {torch.version.cuda})"


def resolve_device(spec: str) -> Any:
    """``auto`` (the first CUDA device if there is one, else the CPU), ``cpu``, ``cuda`` or ``cuda:N`` ->
    a ``torch.device``; a CUDA device this machine lacks raises :class:`DeviceUnavailableError`."""
    import torch

    m = _DEVICE_RE.match(str(spec).strip()) if isinstance(spec, str) else None
    if m is None:
        raise DeviceUnavailableError(f"--device {spec!r}: choose {DEVICE_CHOICES}")
    if m.group(1) == "auto":
        return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    if m.group(1) == "cpu":
        return torch.device("cpu")
    index = int(m.group(2) or 0)
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"--device {spec}: this machine has {describe_device()}; use --device cpu (or auto)"
        )
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceUnavailableError(
            f"--device {spec}: only {count} CUDA device(s) here (cuda:0..cuda:{count - 1})"
        )
    return torch.device("cuda", index)


def device_label(device: Any) -> str:
    """``cpu`` or ``cuda:N`` (what manifests record as ``learner_device`` / ``sampler_device``)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    return device.type


def synchronize(device: Any) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so that a host timer covers it."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def require_cuda(what: str, *, min_capability: tuple[int, int] = (0, 0), index: int = 0) -> tuple[int, int]:
    """The device's capability, or HardwareUnavailableError saying ``what`` needs more than this machine has."""
    cap = cuda_capability(index)
    if cap is None:
        raise HardwareUnavailableError(f"{what} needs a CUDA GPU; this machine has {describe_device()}")
    if cap < min_capability:
        need = f"SM {min_capability[0]}.{min_capability[1]}+"
        raise HardwareUnavailableError(f"{what} needs {need}; this machine has {describe_device(index)}")
    return cap


def import_transformer_engine() -> ModuleType:
    """``transformer_engine.pytorch``, or an error naming the extra to install."""
    try:
        import transformer_engine.pytorch as te
    except (ImportError, OSError, RuntimeError) as exc:
        raise HardwareUnavailableError(
            "Transformer Engine is not importable "
            f"({type(exc).__name__}: {exc}); it is a GPU-only extra: pip install 'transformer-engine[pytorch]>=2.13' "
            "on a CUDA machine"
        ) from None
    return te


def require_te_mxfp8() -> tuple[ModuleType, Any]:
    """(te.pytorch, MXFP8BlockScaling recipe) for the Megatron learner on Blackwell; clear error elsewhere."""
    require_cuda("MXFP8 training with Transformer Engine", min_capability=(10, 0))
    te = import_transformer_engine()
    from transformer_engine.common.recipe import MXFP8BlockScaling

    return te, MXFP8BlockScaling()


# (min capability, max capability exclusive or None, min CUDA build) of torch._scaled_mm per precision id,
# as torch's aten/src/ATen/native/cuda/ScaledBlas.cpp checks them (the DeepSeek-style blockwise recipe is
# Hopper-only and needs cuBLASLt >= 12.9; MX block scaling is Blackwell's).
SCALED_MM_NEEDS: dict[str, tuple[tuple[int, int], tuple[int, int] | None, tuple[int, int]]] = {
    "fp8-tensor": ((8, 9), None, (12, 1)),
    "fp8-rowwise": ((9, 0), None, (12, 1)),
    "fp8-block128": ((9, 0), (10, 0), (12, 9)),
    "mxfp8": ((10, 0), (11, 0), (12, 8)),
}


def scaled_mm_unsupported(precision: str, capability: tuple[int, int] | None, cuda: str | None) -> str | None:
    """Why ``torch._scaled_mm`` cannot run ``precision`` on a device of ``capability`` with a torch built for
    CUDA ``cuda`` (pure; None when it can)."""
    if precision not in SCALED_MM_NEEDS:
        return f"no torch._scaled_mm recipe for {precision}"
    lo, hi, min_cuda = SCALED_MM_NEEDS[precision]
    if capability is None:
        return "no CUDA device"
    sm = f"SM {capability[0]}.{capability[1]}"
    if capability < lo or (hi is not None and capability >= hi):
        need = f"SM {lo[0]}.{lo[1]}" + (f"..{hi[0] - 1}.x" if hi is not None else "+")
        return f"{precision} GEMMs need {need}; this GPU is {sm}"
    built = tuple(int(p) for p in (cuda or "0.0").split(".")[:2])
    if built < min_cuda:
        return f"{precision} GEMMs need a torch built for CUDA >= {min_cuda[0]}.{min_cuda[1]}, got {cuda}"
    return None


def require_scaled_mm(precision: str, index: int = 0) -> None:
    """``torch._scaled_mm`` for ``precision`` on CUDA device ``index``, or HardwareUnavailableError why not."""
    import torch

    if precision not in SCALED_MM_NEEDS:
        raise ValueError(
            f"no torch._scaled_mm path for precision {precision!r}; use one of {', '.join(SCALED_MM_NEEDS)}"
        )
    why = scaled_mm_unsupported(precision, cuda_capability(index), torch.version.cuda)
    if why is not None:
        raise HardwareUnavailableError(
            f"{precision} GEMMs (torch._scaled_mm): {why} ({describe_device(index)})"
        )
