"""vLLM-specific weight-sync faults, applied to a live ``VllmSampler`` at its seams, never to what the checker reads.

Seams: the push the client sends (``transform_push``: HF-named BF16 tensors after unpacking) and the prefix
cache reset that follows a load. Same ``Fault`` records as ``pipeline.sync.faults`` so ``mxperf faults`` can run
them; the invariant named is the one that must catch it.

==========================  ====  ===========================================================================
name                        inv.  what happens in vLLM
==========================  ====  ===========================================================================
vllm-stale-prefix-cache     I6    ``reset_prefix_cache`` skipped after ``reload_weights``: prompts cached under
                                  the old weights are served as prefix hits under the new version
vllm-partial-push           I2    layer 1's ``down_proj`` left out of every push after the first; vLLM's
                                  ``reload_weights`` accepts a partial iterator and keeps the old rows
vllm-gate-up-swapped-names  I3    layer 0's ``gate_proj`` / ``up_proj`` pushed under each other's names:
                                  vLLM's stacked mapping puts them in the wrong half of ``gate_up_proj``
==========================  ====  ===========================================================================
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.sync.faults import Fault


def skip_prefix_reset(engine: Any) -> None:
    engine.reset_prefix_cache_on_load = False


def _wrap_push(engine: Any, mutate: Any) -> None:
    original = engine.transform_push

    def transform_push(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return mutate(original(tensors))

    engine.transform_push = transform_push


def drop_tensor_after_first(engine: Any, name: str = "model.layers.1.mlp.down_proj.weight") -> None:
    """Once the engine holds a complete version, every later push leaves ``name`` out."""

    def mutate(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return t if engine.weight_version < 0 else {k: v for k, v in t.items() if k != name}

    _wrap_push(engine, mutate)


def swap_gate_up_names(engine: Any, layer: int = 0) -> None:
    gate, up = f"model.layers.{layer}.mlp.gate_proj.weight", f"model.layers.{layer}.mlp.up_proj.weight"

    def mutate(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(t)
        if gate in t and up in t:
            out[gate], out[up] = t[up], t[gate]
        return out

    _wrap_push(engine, mutate)


VLLM_FAULTS: tuple[Fault, ...] = (
    Fault(
        "vllm-stale-prefix-cache",
        "I6",
        "vLLM prefix cache not reset after reload_weights",
        "https://github.com/NVIDIA-NeMo/RL/pull/4018",
        skip_prefix_reset,
    ),
    Fault(
        "vllm-partial-push",
        "I2",
        "a tensor left out of the push to vLLM; reload_weights keeps the old rows",
        "https://github.com/THUDM/slime/issues/2280",
        drop_tensor_after_first,
    ),
    Fault(
        "vllm-gate-up-swapped-names",
        "I3",
        "gate_proj and up_proj pushed under each other's names",
        "https://github.com/sgl-project/sglang/pull/32430",
        swap_gate_up_names,
    ),
)


def get_vllm_fault(name: str) -> Fault:
    for f in VLLM_FAULTS:
        if f.name == name:
            return f
    raise KeyError(f"unknown vLLM fault {name!r}; known: {', '.join(f.name for f in VLLM_FAULTS)}")
