"""Engine interfaces: what the RL loop needs from a learner and from a sampler.

The loop (``pipeline.experiments.loop``) only talks to these protocols, so mxperf's own engines (``pipeline.learner.engine``,
``pipeline.sampler.engine``) and the real ones (Megatron-core learner, vLLM sampler in its own process) plug in
without touching it. Weights cross from learner to sampler as **bytes** (safetensors, made by
:func:`pack_weights` below; ``pipeline.sync.weight_sync`` drives the sync), as they would across processes: a sampler never shares tensor storage with the
learner.

Names. Learner-side tensors use Hugging Face checkpoint names (``model.layers.0.self_attn.q_proj.weight``,
MoE experts ``model.layers.0.mlp.experts.gate_up_proj`` [E, 2I, H] and ``...experts.down_proj`` [E, H, I]).
A quantized tensor travels as its uint8 bytes under its own name plus its scale under
``scale_name(name)``: ``...q_proj.weight_scale`` / ``...experts.gate_up_proj_scale``.

The sampler holds weights in **its own layout**, as vLLM does (``pipeline.sampler.weights``): fused
``self_attn.qkv_proj`` [q; k; v] and ``mlp.gate_up_proj`` [gate; up], MoE ``mlp.experts.w13_weight`` /
``w2_weight``, FP8 weights as bytes plus scales, and a kernel-side derived copy of each scale
(``weight_scale_swizzled``) rebuilt after every load.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


def scale_name(name: str) -> str:
    """Name under which the scale of quantized tensor ``name`` travels and is stored."""
    return name[: -len(".weight")] + ".weight_scale" if name.endswith(".weight") else name + "_scale"


PAYLOAD_FORMAT = "mxperf-weights/1"


def pack_weights(tensors: Mapping[str, torch.Tensor], version: int, *, grid: str = "bf16") -> bytes:
    """Serialize HF-named tensors to safetensors bytes with ``version`` and the ``grid`` of the quantized
    ones in the metadata. The bytes own their data: nothing aliases the learner's tensors."""
    from safetensors.torch import save

    if not tensors:
        raise ValueError("pack_weights: no tensors to send")
    flat = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    meta = {"format": PAYLOAD_FORMAT, "version": str(int(version)), "grid": grid}
    return save(flat, metadata=meta)


def payload_metadata(payload: bytes) -> dict[str, str]:
    """The ``__metadata__`` of safetensors bytes (header: u64 little-endian length, then JSON)."""
    if len(payload) < 8:
        raise ValueError(f"weight payload of {len(payload)} bytes is too short to be safetensors")
    (n,) = struct.unpack("<Q", payload[:8])
    try:
        header = json.loads(payload[8 : 8 + n])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"weight payload header is not valid JSON ({exc})") from None
    return dict(header.get("__metadata__", {}))


def unpack_weights(payload: bytes) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, metadata) of a payload made by :func:`pack_weights`; ``metadata["version"]`` is an int."""
    from safetensors.torch import load

    meta: dict[str, Any] = payload_metadata(payload)
    if meta.get("format") != PAYLOAD_FORMAT or "version" not in meta:
        raise ValueError(f"not an mxperf weight payload (metadata {meta}); expected format {PAYLOAD_FORMAT}")
    meta["version"] = int(meta["version"])
    return load(payload), meta


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (self.temperature > 0):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Rollout:
    """One generated sequence, as the sampler saw it."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # sampler's log-prob of each sampled response token (pre-temperature: raw model)
    dispatch_version: int  # weight version stamped when the request was admitted
    weight_versions: set[int] = field(default_factory=set)  # every version used while decoding it
    finish_reason: str = "length"  # "stop" | "length"


@runtime_checkable
class SamplerEngine(Protocol):
    """A generation engine with its own copy of the weights."""

    mode: str  # the precision id of the sampler's weights (bf16, mxfp8, mxfp8-floor, ...)

    @property
    def weight_version(self) -> int: ...

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Rollout]: ...

    def update_weights(self, payload: bytes, version: int) -> None:
        """Load a full weight push (safetensors bytes), then refresh every derived / auxiliary state."""
        ...

    def read_back(self) -> dict[str, torch.Tensor]:
        """The live weights as the kernels use them (sampler layout names), read from the engine itself."""
        ...

    def aux_state(self) -> Mapping[str, Any]:
        """Version stamps of auxiliary state for invariant I6/I7 (prefix cache, KV-cache scales, ...)."""
        ...


@runtime_checkable
class LearnerBackend(Protocol):
    """A policy being trained: log-probs, GRPO updates over micro-batches, and weight export."""

    precision: str  # "bf16" | "mxfp8" (precision ids, docs/contracts.md)

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Per-token log-prob of each next token, [B, T-1], in the learner's full-sequence forward."""
        ...

    def train_step(self, batch: Any, tokens_per_microbatch: int) -> dict[str, float]:
        """One optimizer step over ``batch`` packed into micro-batches of at most that many tokens."""
        ...

    def export_weights(self, send_quantized: Callable[[str], bool]) -> dict[str, torch.Tensor]:
        """Forward weights in HF names. For a tensor the learner quantizes (MXFP8 learner, policy-eligible)
        and for which ``send_quantized(name)`` is true: the exact uint8 bytes its fprop uses plus the uint8
        E8M0 scale under ``scale_name(name)``. Every other tensor: its BF16 value (the sampler may then
        quantize it online with its own rule, as vLLM does with a BF16 checkpoint)."""
        ...
