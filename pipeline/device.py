"""Lazy imports and capability checks for the GPU-only paths, each failing with a message naming what is missing.

Transformer Engine and CUDA vLLM are optional extras (``pip install 'mxperf[gpu]'`` on a CUDA machine). They are
never imported at module level anywhere in mxperf: the CPU install neither has nor needs them (on this kind of
machine ``transformer_engine`` cannot even be imported, and installing it breaks ``import megatron.core``).

Which hardware runs what (SPEC precision ids):

===============  ===========================  ===================================================
id               needs                        where
===============  ===========================  ===================================================
``mxfp8``        SM 10.x (Blackwell) tensor   TE ``MXFP8BlockScaling``; vLLM ``quantization="mxfp8"``
                 cores for MXFP8 GEMMs
``fp8-tensor``   SM 8.9+ (Ada, Hopper, ...)   ``torch._scaled_mm`` with per-tensor fp32 scales
``fp8-rowwise``  SM 9.0+                      ``torch._scaled_mm`` with per-row fp32 scales
===============  ===========================  ===================================================
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


class HardwareUnavailableError(RuntimeError):
    """A GPU path was asked for on a machine (or install) that cannot run it."""


def cuda_capability() -> tuple[int, int] | None:
    """(major, minor) of CUDA device 0, or None without a usable CUDA device."""
    import torch

    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(0))  # type: ignore[return-value]


def describe_device() -> str:
    import torch

    cap = cuda_capability()
    if cap is None:
        return f"no CUDA device (torch {torch.__version__})"
    return f"{torch.cuda.get_device_name(0)} (SM {cap[0]}.{cap[1]}, torch {torch.__version__}, CUDA {torch.version.cuda})"


def require_cuda(what: str, *, min_capability: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """The device's capability, or HardwareUnavailableError saying ``what`` needs more than this machine has."""
    cap = cuda_capability()
    if cap is None:
        raise HardwareUnavailableError(f"{what} needs a CUDA GPU; this machine has {describe_device()}")
    if cap < min_capability:
        need = f"SM {min_capability[0]}.{min_capability[1]}+"
        raise HardwareUnavailableError(f"{what} needs {need}; this machine has {describe_device()}")
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


def require_cuda_vllm_mxfp8() -> None:
    """vLLM's online MXFP8 (``quantization="mxfp8"``) needs a CUDA vLLM build and an SM 10.x GPU."""
    require_cuda('vLLM quantization="mxfp8"', min_capability=(10, 0))


def require_scaled_mm(precision: str) -> None:
    """``torch._scaled_mm`` FP8 GEMMs: per-tensor needs SM 8.9+, rowwise SM 9.0+."""
    need = {"fp8-tensor": (8, 9), "fp8-rowwise": (9, 0)}
    if precision not in need:
        raise ValueError(
            f"no torch._scaled_mm path for precision {precision!r}; use fp8-tensor or fp8-rowwise"
        )
    require_cuda(f"{precision} GEMMs (torch._scaled_mm)", min_capability=need[precision])
