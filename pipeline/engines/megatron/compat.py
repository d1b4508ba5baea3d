"""The one compatibility layer for megatron-core on CPU-only torch.

megatron-core (measured: 0.16.1) builds, initializes and runs its local (non-Transformer-Engine) GPT spec on a
CPU, except for a handful of calls that assume CUDA:

- ``torch.cuda.current_device()``: the rotary embedding and ~40 other places build tensors on "the current
  device". Here that is the CPU.
- CUDA RNG state: ``model_parallel_cuda_manual_seed`` and the ``CudaRNGStatesTracker`` fork / restore the CUDA
  generator around dropout in tensor-parallel regions. Here the CPU generator plays that role, so a tracked
  region still restores the surrounding RNG stream exactly.
- MoE without TE: ``moe_utils`` references ``te_general_gemm`` from a failed optional import (a NameError on the
  router's first call). Here it is ``None``, which makes the router fall back to ``torch`` matmul.

These patches change process-wide state (``torch.cuda`` functions), so they are applied only when CUDA is absent,
only once, and only in the process that runs the Megatron learner. Tests run Megatron in a subprocess so the
patch can never leak into another test. ``apply_cpu_compat()`` returns the list of what it patched, recorded in
the run manifest.
"""

from __future__ import annotations

import importlib
import os

import torch

_APPLIED: list[str] = []


def _cpu_rng_get(*_args: object, **_kwargs: object) -> torch.Tensor:
    return torch.get_rng_state()


def _cpu_rng_set(state: torch.Tensor, *_args: object, **_kwargs: object) -> None:
    torch.set_rng_state(state)


def _cpu_manual_seed(seed: int) -> None:
    """The tracker calls ``torch.cuda.manual_seed(seed)`` between a get and a set of the RNG state: seeding the
    CPU generator there gives each tracked region its own reproducible stream and the caller's is restored."""
    torch.manual_seed(seed)


def apply_cpu_compat() -> list[str]:
    """Make megatron-core run on CPU-only torch. Idempotent; a no-op (returns []) when CUDA is available."""
    if torch.cuda.is_available():
        return []
    if _APPLIED:
        return list(_APPLIED)
    patched: list[str] = []
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.get_rng_state = _cpu_rng_get  # type: ignore[assignment]
    torch.cuda.set_rng_state = _cpu_rng_set  # type: ignore[assignment]
    torch.cuda.manual_seed = _cpu_manual_seed  # type: ignore[assignment]
    patched += [
        "torch.cuda.current_device->cpu",
        "torch.cuda.{get,set}_rng_state->cpu",
        "torch.cuda.manual_seed->cpu",
    ]

    rnd = importlib.import_module("megatron.core.tensor_parallel.random")
    rnd._get_cuda_rng_state = _cpu_rng_get
    rnd._set_cuda_rng_state = _cpu_rng_set
    patched.append("megatron.core.tensor_parallel.random._{get,set}_cuda_rng_state->cpu")

    moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
    if getattr(moe_utils, "te_general_gemm", None) is None:
        moe_utils.te_general_gemm = None
        patched.append("megatron.core.transformer.moe.moe_utils.te_general_gemm=None")
    _APPLIED.extend(patched)
    return list(patched)


def init_single_process_group(port: int | None = None) -> None:
    """World size 1 over gloo plus ``initialize_model_parallel(1, 1)``: what Megatron needs before building a
    model. Idempotent. ``port`` (or ``MASTER_PORT``) must be free; the default picks one."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if port is not None:
            os.environ["MASTER_PORT"] = str(port)
        elif "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(_free_port())
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
