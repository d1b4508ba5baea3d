"""The sampler's weight layout: which HF tensor rows land in which sampler tensor rows (vLLM's Qwen3 layout).

    HF name (learner)                               sampler destination (rows along N)
    layers.l.self_attn.{q,k,v}_proj.weight      ->  layers.l.self_attn.qkv_proj.weight   [q; k; v]
    layers.l.mlp.{gate,up}_proj.weight          ->  layers.l.mlp.gate_up_proj.weight     [gate; up]
    layers.l.mlp.experts.gate_up_proj [E,2I,H]  ->  layers.l.mlp.experts.w13_weight      [E, [gate; up], H]
    layers.l.mlp.experts.down_proj    [E,H,I]   ->  layers.l.mlp.experts.w2_weight
    everything else                             ->  the same name (embeddings, norms, router, LM head)

Each arrow is a list of :class:`Piece` (source rows -> destination rows), vLLM's ``stacked_params_mapping``.
:func:`sampler_layout` is pure: the store's loader starts from it and the invariant checker rebuilds it
independently (with the learner's precision policy) to know what the sampler must hold.

Grid fraction F: ``round(F * L)`` decoder layers are on the grid, spread evenly (layer ``floor(i * L / n)``
for i < n, so F = 0.5 of 4 layers is {0, 2}); the other layers, like embeddings, norms, router and LM head
(the precision policy, notes 2.5), stay BF16.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pipeline.interfaces import scale_name
from tracing.outputs.precisions import PIPELINE_PRECISIONS

SAMPLER_MODES = PIPELINE_PRECISIONS  # a sampler runs on one of the pipeline's grids
MX_RULES = {"mxfp8": "te", "mxfp8-te212": "te212", "mxfp8-floor": "floor"}
DERIVED_SUFFIX = "_swizzled"

_LINEAR_RE = re.compile(
    r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj\.weight|mlp\.(gate|up|down)_proj\.weight"
    r"|mlp\.experts\.(gate_up_proj|down_proj))$"
)
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


def default_is_quantized(hf_name: str) -> bool:
    """The Megatron + TE precision policy (notes 2.5, ``pipeline.quant.policy``): decoder-layer linears and
    experts are quantized; embeddings, norms, the MoE router (``mlp.gate``) and the LM head stay BF16."""
    return bool(_LINEAR_RE.match(hf_name)) and _numerics_policy().is_quantized(hf_name)


def _numerics_policy() -> Any:
    from pipeline.quant.policy import PrecisionPolicy

    return PrecisionPolicy("mxfp8")


def derived_name(scale: str) -> str:
    """Name of the kernel-side derived copy of scale tensor ``scale``."""
    return scale + DERIVED_SUFFIX


def layer_of(name: str) -> int | None:
    m = _LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def grid_layers(num_layers: int, fraction: float) -> frozenset[int]:
    """The decoder layers on the grid for grid fraction ``fraction`` (see the module docstring)."""
    if not 0.0 <= fraction <= 1.0 or math.isnan(fraction):
        raise ValueError(f"grid fraction must be in [0, 1], got {fraction}")
    n = math.floor(fraction * num_layers + 0.5)
    return frozenset(math.floor(i * num_layers / n) for i in range(n)) if n else frozenset()


@dataclass(frozen=True)
class Piece:
    """Rows ``src_rows`` of HF tensor ``source`` (expert ``expert`` when 3-D) go to rows ``dst_rows`` of
    sampler tensor ``dest`` (same expert). ``None`` rows mean the whole tensor (1-D or unfused)."""

    source: str
    dest: str
    src_rows: tuple[int, int] | None = None
    dst_rows: tuple[int, int] | None = None
    expert: int | None = None

    def src_index(self) -> tuple[Any, ...]:
        return _index(self.expert, self.src_rows)

    def dst_index(self) -> tuple[Any, ...]:
        return _index(self.expert, self.dst_rows)


def _index(expert: int | None, rows: tuple[int, int] | None) -> tuple[Any, ...]:
    idx: tuple[Any, ...] = () if expert is None else (expert,)
    return idx + ((slice(*rows),) if rows is not None else ())


@dataclass(frozen=True)
class DestSpec:
    """One sampler tensor: its shape, whether it is stored on the grid, and its decoder layer."""

    name: str
    shape: tuple[int, ...]
    quantized: bool
    layer: int | None

    @property
    def scale(self) -> str:
        return scale_name(self.name)

    @property
    def derived(self) -> str:
        return derived_name(self.scale)


@dataclass(frozen=True)
class SamplerLayout:
    dests: dict[str, DestSpec]
    pieces: tuple[Piece, ...]
    ignored: frozenset[str] = frozenset()  # HF names a sampler legitimately skips (tied LM head)

    def pieces_by_source(self) -> dict[str, list[Piece]]:
        out: dict[str, list[Piece]] = {}
        for p in self.pieces:
            out.setdefault(p.source, []).append(p)
        return out

    def dest_of(self, source: str) -> DestSpec | None:
        for p in self.pieces:
            if p.source == source:
                return self.dests[p.dest]
        return None


def _policy_fn(policy: Any) -> Callable[[str], bool]:
    if policy is None:
        return default_is_quantized
    if hasattr(policy, "is_quantized"):
        return policy.is_quantized
    if callable(policy):
        return policy
    raise TypeError(f"policy must have is_quantized(name) or be callable, got {type(policy).__name__}")


def sampler_layout(config: Any, mode: str, grid_fraction: float = 1.0, policy: Any = None) -> SamplerLayout:
    """The canonical sampler layout of a Qwen3 / Qwen3-MoE ``config`` (pure; the checker uses it too)."""
    check_mode(mode)
    is_q = _policy_fn(policy)
    n_layers, h = config.num_hidden_layers, config.hidden_size
    nq, nkv = config.num_attention_heads, config.num_key_value_heads
    d = getattr(config, "head_dim", None) or h // nq
    on_grid = grid_layers(n_layers, grid_fraction) if mode != "bf16" else frozenset()
    dests: dict[str, DestSpec] = {}
    pieces: list[Piece] = []

    def add(dest: str, shape: tuple[int, ...], parts: Iterable[Piece], layer: int | None) -> None:
        parts = list(parts)
        quant = (
            mode != "bf16"
            and len(shape) >= 2
            and (layer in on_grid if layer is not None else bool(on_grid))
            and all(is_q(p.source) for p in parts)
        )
        dests[dest] = DestSpec(dest, shape, quant, layer)
        pieces.extend(parts)

    def same(name: str, shape: tuple[int, ...], layer: int | None = None) -> None:
        add(name, shape, [Piece(name, name)], layer)

    tied = bool(getattr(config, "tie_word_embeddings", False))
    same("model.embed_tokens.weight", (config.vocab_size, h))
    same("model.norm.weight", (h,))
    if not tied:
        same("lm_head.weight", (config.vocab_size, h))
    num_experts = getattr(config, "num_experts", 0) or 0
    sparse_step = getattr(config, "decoder_sparse_step", 1) or 1
    mlp_only = set(getattr(config, "mlp_only_layers", []) or [])
    for layer in range(n_layers):
        p = f"model.layers.{layer}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            same(f"{p}.{norm}.weight", (h,), layer)
        for norm in ("q_norm", "k_norm"):
            same(f"{p}.self_attn.{norm}.weight", (d,), layer)
        a = f"{p}.self_attn"
        qkv = [
            (f"{a}.q_proj.weight", nq * d),
            (f"{a}.k_proj.weight", nkv * d),
            (f"{a}.v_proj.weight", nkv * d),
        ]
        _fused_rows(add, f"{a}.qkv_proj.weight", h, qkv, layer)
        same(f"{a}.o_proj.weight", (h, nq * d), layer)
        if num_experts and layer not in mlp_only and (layer + 1) % sparse_step == 0:
            i, e = config.moe_intermediate_size, num_experts
            x = f"{p}.mlp.experts"
            same(f"{p}.mlp.gate.weight", (e, h), layer)
            gu = f"{x}.gate_up_proj"
            w13 = [Piece(gu, f"{x}.w13_weight", (0, i), (0, i), ex) for ex in range(e)]
            w13 += [Piece(gu, f"{x}.w13_weight", (i, 2 * i), (i, 2 * i), ex) for ex in range(e)]
            add(f"{x}.w13_weight", (e, 2 * i, h), sorted(w13, key=lambda q: (q.expert, q.dst_rows)), layer)
            w2 = [Piece(f"{x}.down_proj", f"{x}.w2_weight", None, None, ex) for ex in range(e)]
            add(f"{x}.w2_weight", (e, h, i), w2, layer)
        else:
            i, m = config.intermediate_size, f"{p}.mlp"
            gate_up = [(f"{m}.gate_proj.weight", i), (f"{m}.up_proj.weight", i)]
            _fused_rows(add, f"{m}.gate_up_proj.weight", h, gate_up, layer)
            same(f"{m}.down_proj.weight", (h, i), layer)
    ignored = frozenset({"lm_head.weight"}) if tied else frozenset()
    return SamplerLayout(dests, tuple(pieces), ignored)


def _fused_rows(add: Callable[..., None], dest: str, k: int, srcs: list[tuple[str, int]], layer: int) -> None:
    parts, row = [], 0
    for src, n in srcs:
        parts.append(Piece(src, dest, None, (row, row + n)))
        row += n
    add(dest, (row, k), parts, layer)


def check_mode(mode: str) -> str:
    if mode not in SAMPLER_MODES:
        raise ValueError(f"unknown sampler weight mode {mode!r}; choose one of {', '.join(SAMPLER_MODES)}")
    return mode
