"""Weight-sync faults drawn from failures reported in real RL frameworks, one or more per invariant, each
applied by patching a well-defined seam of a live engine -- never by editing what the checker reads.

Seams (all on one engine instance, before its first sync):

- the **payload** the engine receives (``update_weights`` wrapped: bytes unpacked, corrupted, repacked), as a
  broken exporter or transport would deliver it;
- the **loader** of the store (``SamplerWeights.routes``, the name -> destination-rows mapping; its
  ``_check_complete`` guard; ``accept_sent_bytes`` / ``online_rule``, its online quantizer);
- **post-load processing** (``process_weights_after_loading``, vLLM's PWAL);
- the store's **precision policy** (the engine's store replaced by one built with another policy);
- the engine's **update steps** (``_pause_admission``, ``_drain``, ``_load``, ``_recalibrate_kv_scales``,
  ``_reset_prefix_cache``).

``FAULTS`` lists them; :func:`applicable` filters by model (MoE-only faults) and each fault says which run
settings make its damage visible (``needs``: an FP8 KV cache for a stale KV scale, async generation for a
mid-sync admission). The runner is :mod:`pipeline.experiments.fault_runs` / ``mxperf faults``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from pipeline.interfaces import pack_weights, scale_name, unpack_weights
from pipeline.sampler.weights import SamplerWeights, default_is_quantized


@dataclass(frozen=True)
class Fault:
    """One injectable failure: what it breaks, where it comes from, and how it is applied."""

    name: str
    invariant: str  # the invariant that must catch it
    description: str
    source: str  # real-world report (notes section 6)
    apply: Callable[[Any], None]  # patches an engine in place
    moe_only: bool = False
    needs: frozenset[str] = field(default_factory=frozenset)  # run settings: "kv-fp8", "async"


# -- payload faults ------------------------------------------------------------------------------------------
def _wrap_payload(engine: Any, mutate: Callable[[dict[str, torch.Tensor]], None]) -> None:
    original = engine.update_weights

    def update_weights(payload: bytes, version: int) -> None:
        tensors, meta = unpack_weights(payload)
        mutate(tensors)
        original(pack_weights(tensors, meta["version"], grid=meta.get("grid", "bf16")), version)

    engine.update_weights = update_weights


def flip_scale_byte(engine: Any) -> None:
    """XOR bit 4 of the largest E8M0 scale byte of layer 0's o_proj (x or / 2^16 on one 32-element block)."""

    def mutate(t: dict[str, torch.Tensor]) -> None:
        name = scale_name("model.layers.0.self_attn.o_proj.weight")
        if name in t:
            s = t[name].clone()
            flat = s.view(-1)
            flat[int(torch.argmax(flat))] ^= 0x10
            t[name] = s

    _wrap_payload(engine, mutate)


def drop_tensor(engine: Any, *, validate: bool = False) -> None:
    """Leave layer 1's down_proj (and its scale) out of every refit after the first (complete) load; the loader
    accepts it (SGLang only warned 'partially updated') unless ``validate``."""
    seen = {"loads": 0}

    def mutate(t: dict[str, torch.Tensor]) -> None:
        seen["loads"] += 1
        if seen["loads"] == 1:
            return
        for name in ("model.layers.1.mlp.down_proj.weight", "model.layers.1.mlp.experts.down_proj"):
            t.pop(name, None)
            t.pop(scale_name(name), None)

    _wrap_payload(engine, mutate)
    if not validate:
        _skip_completeness_guard(engine.weights)


# -- loader faults --------------------------------------------------------------------------------------------
def _skip_completeness_guard(store: SamplerWeights) -> None:
    store._check_complete = lambda: None  # the loader logs at debug level and carries on


def floor_requantize(engine: Any) -> None:
    """The sampler ignores the learner's bytes and re-quantizes with the OCP FLOOR rule (vLLM's torch
    fallback ``_mxfp8_e4m3_quantize_torch`` uses floor(log2 amax))."""
    engine.weights.accept_sent_bytes = False
    engine.weights.online_rule = "floor"


def _after_first_load(store: SamplerWeights, patch: Callable[[SamplerWeights], None]) -> None:
    """Apply ``patch`` to the store once its first (startup, complete) load is done: the fault hits refits."""
    original = store.load_weights

    def load_weights(payload: bytes) -> Any:
        out = original(payload)
        if not getattr(store, "_fault_armed", False):
            store._fault_armed = True
            patch(store)
        return out

    store.load_weights = load_weights


def drop_expert(engine: Any) -> None:
    """From the first refit on, the pieces of layer 0's last expert match no name and are skipped at debug
    level (ROCm/ATOM PR #2028: routed experts kept their load-time weights)."""

    def patch(store: SamplerWeights) -> None:
        last = store.config.num_experts - 1
        for source, pieces in store.routes.items():
            if source.startswith("model.layers.0.mlp.experts."):
                store.routes[source] = [p for p in pieces if p.expert != last]
        _skip_completeness_guard(store)

    _after_first_load(engine.weights, patch)


def _swap_dst_rows(store: SamplerWeights, source_a: str, source_b: str) -> None:
    """Load HF tensors ``source_a`` and ``source_b`` into each other's rows of their fused destination."""
    (pa,), (pb,) = store.routes[source_a], store.routes[source_b]
    store.routes[source_a], store.routes[source_b] = (
        [replace(pa, dst_rows=pb.dst_rows)],
        [replace(pb, dst_rows=pa.dst_rows)],
    )


def swap_gate_up(engine: Any) -> None:
    """Gate and up halves loaded in the wrong order in layer 0 (SGLang PR #32430: [gate;up] vs [up;gate])."""
    store = engine.weights
    fused = "model.layers.0.mlp.experts.gate_up_proj"
    if fused in store.routes:  # MoE: each expert's halves trade places
        pieces = store.routes[fused]
        halves = {p.src_rows for p in pieces}
        other = {h: next(x for x in halves if x != h) for h in halves}
        store.routes[fused] = [replace(p, dst_rows=other[p.src_rows]) for p in pieces]
    else:
        _swap_dst_rows(store, "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight")


def wrong_qkv_order(engine: Any) -> None:
    """Layer 0's K and V land in each other's rows of the fused qkv_proj ([q; v; k])."""
    attn = "model.layers.0.self_attn"
    _swap_dst_rows(engine.weights, f"{attn}.k_proj.weight", f"{attn}.v_proj.weight")


def stale_derived_scales(engine: Any) -> None:
    """Post-load processing runs once (vLLM's ``_already_called_process_weights_after_loading`` guard): the
    swizzled scale copy keeps the first version's scales (verl PR #7519, SGLang PR #22484)."""
    store = engine.weights
    original = store.process_weights_after_loading
    done = {"n": 0}

    def once() -> None:
        if done["n"] == 0:
            original()
        done["n"] += 1

    store.process_weights_after_loading = once


def quantize_module(pattern: str) -> Callable[[Any], None]:
    """Build the engine's store with a policy that also quantizes ``pattern`` modules (a skip list that misses
    a spelling: NeMo-RL PR #3614 quantized MoE routers)."""

    def apply(engine: Any) -> None:
        def policy(name: str) -> bool:
            return default_is_quantized(name) or pattern in name

        old = engine.weights
        engine.weights = SamplerWeights(
            old.config, old.mode, old.grid_fraction, policy=policy, device=old.device
        )

    return apply


# -- engine step faults ----------------------------------------------------------------------------------------
def skip_kv_recalibration(engine: Any) -> None:
    """FP8 KV-cache scales are not recalibrated at sync and silently stay 1.0 (NeMo-RL #3225)."""
    engine._recalibrate_kv_scales = lambda version: None


def skip_prefix_reset(engine: Any) -> None:
    """The prefix cache is not reset at sync: prompts reuse KV from older weights (NeMo-RL PR #4018)."""
    engine._reset_prefix_cache = lambda: None


def admit_mid_sync(engine: Any, *, wait_s: float = 2.0) -> None:
    """Requests stay admitted and are not drained during a sync (verl PR #7511): a request in flight decodes
    while the load writes the weights. The overlap is made deterministic, as if the sync always landed
    mid-decode: a request submitted asynchronously (on the engine's worker thread) waits, once admitted, for
    the next load to begin (at most ``wait_s``), and the load waits until that request has observed the
    half-loaded engine (at most ``wait_s``) before writing."""
    loading, observed = threading.Event(), threading.Event()
    engine._pause_admission = lambda: None
    engine._drain = lambda: None
    original_load, original_prefill, original_versions = engine._load, engine._prefill, engine._versions_now

    def on_worker() -> bool:
        return threading.current_thread() is not threading.main_thread()

    def load(payload: bytes) -> None:
        loading.set()
        observed.wait(timeout=wait_s)
        try:
            original_load(payload)
        finally:
            loading.clear()
            observed.clear()

    def prefill(prompts: Any) -> Any:
        if on_worker():
            loading.wait(timeout=wait_s)
        return original_prefill(prompts)

    def versions_now() -> set[int]:
        out = original_versions()
        if on_worker() and len(out) > 1:
            observed.set()
        return out

    engine._load, engine._prefill, engine._versions_now = load, prefill, versions_now


FAULTS: tuple[Fault, ...] = (
    Fault(
        "flipped-scale-byte",
        "I1",
        "one E8M0 scale byte of the pushed bytes has a flipped bit",
        "notes §6 I1 injection list (corrupted transfer)",
        flip_scale_byte,
    ),
    Fault(
        "floor-requantize",
        "I1",
        "sampler re-quantizes the learner's MXFP8 weights with the FLOOR rule",
        "vLLM mxfp8.py torch fallback; verl #3633 (notes §4, §6 row 16)",
        floor_requantize,
    ),
    Fault(
        "dropped-expert",
        "I2",
        "the last expert of layer 0 is never written by the loader",
        "https://github.com/ROCm/ATOM/pull/2028",
        drop_expert,
        moe_only=True,
    ),
    Fault(
        "partial-sync",
        "I2",
        "a tensor is left out of the push and the loader accepts it",
        "https://github.com/THUDM/slime/issues/2280",
        drop_tensor,
    ),
    Fault(
        "gate-up-swapped",
        "I3",
        "gate and up halves loaded in the wrong order",
        "https://github.com/sgl-project/sglang/pull/32430",
        swap_gate_up,
    ),
    Fault(
        "qkv-order",
        "I3",
        "K and V loaded into each other's rows of the fused QKV",
        "https://github.com/vllm-project/vllm/pull/49335 (layout, silent)",
        wrong_qkv_order,
    ),
    Fault(
        "stale-derived-scales",
        "I4",
        "post-load processing runs once; the swizzled scales stay stale",
        "https://github.com/verl-project/verl/pull/7519",
        stale_derived_scales,
    ),
    Fault(
        "quantized-router",
        "I5",
        "the sampler quantizes the MoE router",
        "https://github.com/NVIDIA-NeMo/RL/pull/3614",
        quantize_module(".mlp.gate.weight"),
        moe_only=True,
    ),
    Fault(
        "quantized-lm-head",
        "I5",
        "the sampler quantizes the LM head the learner keeps BF16",
        "notes §2.5 (fp8_output_proj on one side only)",
        quantize_module("lm_head"),
    ),
    Fault(
        "stale-kv-scale",
        "I6",
        "FP8 KV-cache scales not recalibrated at sync (stay 1.0)",
        "https://github.com/NVIDIA-NeMo/RL/issues/3225",
        skip_kv_recalibration,
        needs=frozenset({"kv-fp8"}),
    ),
    Fault(
        "stale-prefix-cache",
        "I6",
        "prefix cache not reset at sync",
        "https://github.com/NVIDIA-NeMo/RL/pull/4018",
        skip_prefix_reset,
    ),
    Fault(
        "admitted-mid-sync",
        "I7",
        "requests admitted and decoding while the weights load",
        "https://github.com/verl-project/verl/pull/7511",
        admit_mid_sync,
        needs=frozenset({"async"}),
    ),
)


def applicable(is_moe: bool) -> list[Fault]:
    return [f for f in FAULTS if is_moe or not f.moe_only]


def get_fault(name: str) -> Fault:
    for f in FAULTS:
        if f.name == name:
            return f
    raise KeyError(f"unknown fault {name!r}; known: {', '.join(f.name for f in FAULTS)}")
