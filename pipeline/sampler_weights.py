"""The sampler's own weight store, laid out as vLLM holds a Qwen3 model, loaded from sync bytes.

A rollout engine does not hold the learner's tensors. It holds **its own layout** (vLLM
``model_executor/models/qwen3.py`` / ``qwen3_moe.py``) and fills it from a checkpoint-named stream::

    HF name (learner)                               sampler destination (rows along N)
    layers.l.self_attn.{q,k,v}_proj.weight      ->  layers.l.self_attn.qkv_proj.weight   [q; k; v]
    layers.l.mlp.{gate,up}_proj.weight          ->  layers.l.mlp.gate_up_proj.weight     [gate; up]
    layers.l.mlp.experts.gate_up_proj [E,2I,H]  ->  layers.l.mlp.experts.w13_weight      [E, [gate; up], H]
    layers.l.mlp.experts.down_proj    [E,H,I]   ->  layers.l.mlp.experts.w2_weight
    everything else                             ->  the same name (embeddings, norms, router, LM head)

Each arrow is a list of :class:`Piece` (source rows -> destination rows), the ``stacked_params_mapping`` of
vLLM. Fusing is concatenation along N, which commutes with *rowwise* quantization (1x32 blocks along K;
notes 2.3), so MXFP8 bytes and scales can be copied piece by piece.

On-grid linears are stored as uint8 E4M3 bytes plus a scale under ``scale_name(dest)`` (E8M0 bytes for MX
modes, fp32 for FP8 grids) and a **kernel-side derived copy** ``..._scale_swizzled``, rebuilt by
:meth:`SamplerWeights.process_weights_after_loading` after every load (vLLM's post-load processing): the
cuBLAS/FlashInfer 128x4 swizzled E8M0 layout for MX modes, the scale pre-broadcast to one fp32 per (row,
K-block) for FP8 grids. :meth:`linear` dequantizes from the bytes and the **derived** copy, so a stale derived
copy changes outputs exactly as it does on a GPU (verl PR #7519).

Where the bytes come from. When the payload carries quantized bytes on the sampler's own grid, they are
copied. When it carries BF16 (or another grid), the pieces are staged in BF16 and quantized **online with
the sampler's own rule** after the load (vLLM ``Mxfp8OnlineLinearMethod``), on the fused tensor: for
per-tensor / 128x128 grids that is a different result from quantizing q, k, v separately, as in vLLM.

Grid fraction F: ``round(F * L)`` decoder layers are on the grid, spread evenly (layer ``floor(i * L / n)``
for i < n, so F = 0.5 of 4 layers is {0, 2}); the other layers, like embeddings, norms, router and LM head
(the precision policy, notes 2.5), stay BF16.

Coverage. Every load counts the writes to each destination row (and scale row) and stamps each row with the
payload's version; :meth:`load_record` exposes them to the invariant checker (I2, I7). A load that leaves a
row unwritten, writes one twice, or carries a name that maps nowhere raises :class:`IncompleteLoadError`
and poisons the store: a failed sync is fail-stop, the engine refuses to compute until a complete load.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.engines import scale_name

SAMPLER_MODES = ("bf16", "mxfp8", "mxfp8-te212", "mxfp8-floor", "fp8-tensor", "fp8-block128", "fp8-rowwise")
MX_RULES = {"mxfp8": "te", "mxfp8-te212": "te212", "mxfp8-floor": "floor"}
FP8_BLOCK_K = {"fp8-tensor": None, "fp8-rowwise": None, "fp8-block128": 128}
E4M3_NAN_BYTE = 0x7F
E8M0_NAN_BYTE = 0xFF
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


# -- grids: quantize, derive the kernel-side scale copy, dequantize from it ---------------------------------
def _numerics() -> Any:
    import pipeline.mxfp8 as mx

    return mx


def quantize_to_grid(
    w: torch.Tensor, mode: str, rule: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rowwise-quantize weight ``w`` [N, K] or experts [E, N, K] on ``mode``'s grid -> (uint8 data, scale).

    MX modes: E8M0 scale bytes [.., N, K/32] by ``rule`` (default: the mode's own). FP8 grids: fp32 scales in
    the grid's shape, one set per expert for 3-D weights."""
    mx = _numerics()
    if mode in MX_RULES:
        q = mx.quantize_mxfp8(w, -1, rule=rule or MX_RULES[mode])
        return q.data, q.scale
    if w.ndim == 3:  # one scale grid per expert, as vLLM's FP8 MoE holds them
        qs = [mx.quantize_weight(w[e], mode) for e in range(w.shape[0])]
        return torch.stack([q.data for q in qs]), torch.stack([q.scale for q in qs])
    q = mx.quantize_weight(w, mode)
    return q.data, q.scale


def derive_scale(mode: str, scale: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The kernel-side copy of ``scale`` for a weight of ``shape``: swizzled E8M0 (MX) or fp32 scales
    pre-broadcast to [.., N, K-blocks] (FP8 grids). Pure: rebuilt from the canonical scale every load."""
    if len(shape) == 3:
        return torch.stack([derive_scale(mode, scale[e], shape[1:]) for e in range(shape[0])])
    if mode in MX_RULES:
        return _numerics().swizzle_mxfp8_scales(scale)
    n = shape[0]
    if mode == "fp8-block128":
        return scale.float().repeat_interleave(128, dim=0)[:n].contiguous()
    return scale.float().reshape(-1, 1).expand(n, 1).contiguous()  # per-tensor or per-row


def dequantize_derived(
    mode: str, data: torch.Tensor, derived: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """What the GEMM kernel sees: bytes ``data`` times the **derived** scale copy, in ``dtype``."""
    mx = _numerics()
    if data.ndim == 3:
        return torch.stack(
            [dequantize_derived(mode, data[e], derived[e], dtype) for e in range(data.shape[0])]
        )
    n, k = data.shape
    if mode in MX_RULES:
        scale = mx.unswizzle_mxfp8_scales(derived, n, k // 32)
        return mx.dequantize_mxfp8(mx.MXFP8Tensor(data, scale, -1, MX_RULES[mode], dtype), dtype)
    from pipeline.quant.e4m3 import decode_e4m3

    block = k if derived.shape[1] == 1 else 128
    return (decode_e4m3(data) * derived.repeat_interleave(block, dim=1)[:, :k]).to(dtype)


def dequantize_sent(grid: str, data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Dequantize bytes that arrived on ``grid`` (MX rowwise), to re-quantize them on another grid."""
    mx = _numerics()
    if grid not in MX_RULES:
        raise ValueError(f"payload grid {grid!r}: only MX bytes are sent (learner precision mxfp8)")
    return mx.dequantize_mxfp8(
        mx.MXFP8Tensor(data, scale, -1, MX_RULES[grid], torch.bfloat16), torch.bfloat16
    )


# -- the store ------------------------------------------------------------------------------------------------
class IncompleteLoadError(RuntimeError):
    """A weight load that did not write every destination exactly once (fail-stop: the store is poisoned)."""


@dataclass
class LoadRecord:
    """What the last load did, read back by the invariant checker. Counters are per destination row."""

    version: int
    writes: dict[str, torch.Tensor]  # dest or scale name -> int32 [rows] writes this load
    row_versions: dict[str, torch.Tensor]  # dest name -> int64 [rows] version that last wrote each row
    derived_versions: dict[str, int]  # derived name -> load version it was rebuilt in
    unmapped: list[str] = field(default_factory=list)
    post_process_calls: int = 0  # process_weights_after_loading calls during this load
    poisoned: bool = False


class SamplerWeights:
    """The sampler's weights in vLLM layout (see the module docstring), the only copy its kernels read."""

    def __init__(self, config: Any, mode: str, grid_fraction: float = 1.0, policy: Any = None) -> None:
        self.config = config
        self.mode = check_mode(mode)
        self.grid_fraction = float(grid_fraction)
        self.layout = sampler_layout(config, mode, grid_fraction, policy)
        self.dests = self.layout.dests
        self.routes: dict[str, list[Piece]] = self.layout.pieces_by_source()  # the loader's mapping (a seam)
        self.online_rule = MX_RULES.get(mode)  # rule of online quantization (vLLM's own quantizer)
        self.accept_sent_bytes = True  # copy bytes sent on our own grid instead of re-quantizing them
        self.compute_dtype = torch.bfloat16
        self._store: dict[str, torch.Tensor] = {}
        self._staging: dict[str, torch.Tensor] = {}
        self._cache: dict[str, torch.Tensor] = {}
        self._record = LoadRecord(-1, {}, {}, {})
        self._allocate()

    # -- allocation: every buffer starts as NaN / NaN bytes (what torch.empty may hold) ----------------------
    def _allocate(self) -> None:
        for d in self.dests.values():
            if d.quantized:
                self._store[d.name] = torch.full(d.shape, E4M3_NAN_BYTE, dtype=torch.uint8)
                self._store[d.scale] = self._nan_scale(d)
                self._store[d.derived] = derive_scale(self.mode, self._store[d.scale], d.shape)
            else:
                self._store[d.name] = torch.full(d.shape, float("nan"), dtype=torch.bfloat16)

    def _nan_scale(self, d: DestSpec) -> torch.Tensor:
        probe = torch.zeros(d.shape[-2:], dtype=torch.bfloat16)
        _, s = quantize_to_grid(probe, self.mode)
        shape = (d.shape[0], *s.shape) if len(d.shape) == 3 else tuple(s.shape)
        if s.dtype == torch.uint8:
            return torch.full(shape, E8M0_NAN_BYTE, dtype=torch.uint8)
        return torch.full(shape, float("nan"), dtype=s.dtype)

    @staticmethod
    def _rows(shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(shape[:-1]) if len(shape) >= 2 else (1,)

    # -- loading ----------------------------------------------------------------------------------------------
    def load_weights(self, payload: bytes) -> LoadRecord:
        """Load one full weight push (safetensors bytes from ``pipeline.weight_sync.pack_weights``)."""
        from pipeline.weight_sync import unpack_weights

        tensors, meta = unpack_weights(payload)
        self._begin_load(int(meta["version"]))
        grid = meta.get("grid", "bf16")
        scales = {scale_name(n) for n, t in tensors.items() if t.dtype == torch.uint8}
        for name, t in tensors.items():
            if name in scales:
                continue
            if name not in self.routes:
                if name not in self.layout.ignored:
                    self._record.unmapped.append(name)
                continue
            scale = tensors.get(scale_name(name)) if t.dtype == torch.uint8 else None
            if t.dtype == torch.uint8 and scale is None:
                raise IncompleteLoadError(f"{name}: quantized bytes arrived without {scale_name(name)}")
            for piece in self.routes[name]:
                self._write_piece(piece, t, scale, grid)
        self._check_complete()
        self.process_weights_after_loading()
        return self._record

    def _begin_load(self, version: int) -> None:
        self._cache.clear()
        self._staging.clear()
        old = self._record
        rec = LoadRecord(version, {}, {}, dict(old.derived_versions))
        for d in self.dests.values():
            rows = self._rows(d.shape)
            rec.writes[d.name] = torch.zeros(rows, dtype=torch.int32)
            prev = old.row_versions.get(d.name)
            rec.row_versions[d.name] = (
                prev.clone() if prev is not None else torch.full(rows, -1, dtype=torch.int64)
            )
            if d.quantized:
                rec.writes[d.scale] = torch.zeros(rows, dtype=torch.int32)
        self._record = rec

    def _write_piece(self, piece: Piece, t: torch.Tensor, scale: torch.Tensor | None, grid: str) -> None:
        """Copy one piece into its destination rows (bytes as sent, or BF16 to be quantized after the load)."""
        d = self.dests[piece.dest]
        src, dst = piece.src_index(), piece.dst_index()
        value = t[src]
        if scale is not None:
            if d.quantized and grid == self.mode and self.accept_sent_bytes:
                self._store[d.name][dst] = value
                self._store[d.scale][dst] = scale[src]
                self._record.writes[d.scale][self._row_index(piece)] += 1
                self._mark(piece)
                return
            value = dequantize_sent(grid, value, scale[src])
        if d.quantized:
            if d.name not in self._staging:
                self._staging[d.name] = torch.full(d.shape, float("nan"), dtype=torch.bfloat16)
            self._staging[d.name][dst] = value.to(torch.bfloat16)
        else:
            target = self._store[d.name]
            target[dst] = value.to(torch.bfloat16).reshape(target[dst].shape)
        self._mark(piece)

    @staticmethod
    def _row_index(piece: Piece) -> tuple[Any, ...]:
        return (
            _index(piece.expert, piece.dst_rows)
            if piece.dst_rows or piece.expert is not None
            else (slice(None),)
        )

    def _mark(self, piece: Piece) -> None:
        idx = self._row_index(piece)
        self._record.writes[piece.dest][idx] += 1
        self._record.row_versions[piece.dest][idx] = self._record.version

    def _check_complete(self) -> None:
        """Fail-stop guard: every destination row (and scale row of copied bytes) written exactly once."""
        problems = [f"payload names that map to no sampler tensor: {self._record.unmapped[:3]}"] * bool(
            self._record.unmapped
        )
        for name, count in self._record.writes.items():
            if name in self._staging_scales():
                continue
            bad = int((count != 1).sum())
            if bad:
                problems.append(f"{name}: {bad} of {count.numel()} rows not written exactly once")
        if problems:
            self._record.poisoned = True
            raise IncompleteLoadError(
                f"weight load v{self._record.version} incomplete: " + "; ".join(problems[:4])
            )

    def _staging_scales(self) -> set[str]:
        return {self.dests[n].scale for n in self._staging}

    def process_weights_after_loading(self) -> None:
        """Quantize staged BF16 destinations online, then rebuild every derived scale copy (vLLM PWAL)."""
        rec = self._record
        for name, staged in self._staging.items():
            d = self.dests[name]
            data, scale = quantize_to_grid(
                staged, self.mode, self.online_rule if self.mode in MX_RULES else None
            )
            self._store[d.name], self._store[d.scale] = data, scale
            rec.writes[d.scale] += 1
        self._staging.clear()
        for d in self.dests.values():
            if d.quantized:
                self._rebuild_derived(d)
        self._cache.clear()
        rec.post_process_calls += 1

    def _rebuild_derived(self, d: DestSpec) -> None:
        self._store[d.derived] = derive_scale(self.mode, self._store[d.scale], d.shape)
        self._record.derived_versions[d.derived] = self._record.version

    # -- reading ---------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._record.version

    def load_record(self) -> LoadRecord:
        return self._record

    def tensor(self, name: str) -> torch.Tensor:
        """A weight as the kernels see it (BF16; an on-grid one dequantized from its bytes and *derived*
        scale copy), or a raw scale / derived tensor by its own name."""
        if name == "lm_head.weight" and name not in self.dests and "lm_head.weight" in self.layout.ignored:
            name = "model.embed_tokens.weight"  # tied embeddings: one tensor, as in vLLM
        return self.weight(name) if name in self.dests else self._store[name]

    def read_back(self) -> dict[str, torch.Tensor]:
        """Copies of every stored tensor: weights, bytes, scales and derived copies, in sampler names."""
        return {k: v.detach().clone() for k, v in self._store.items()}

    def is_quantized(self, prefix: str) -> bool:
        return self.dests[prefix + ".weight" if prefix + ".weight" in self.dests else prefix].quantized

    def weight(self, name: str) -> torch.Tensor:
        """The weight as the GEMM sees it (BF16; dequantized from bytes + derived scale), cached per load."""
        if self._record.poisoned:
            raise IncompleteLoadError(
                f"weights of v{self._record.version} are incomplete; refusing to compute"
            )
        w = self._cache.get(name)
        if w is None:
            d = self.dests[name]
            w = self._store[name]
            if d.quantized:
                w = dequantize_derived(self.mode, w, self._store[d.derived], self.compute_dtype)
            self._cache[name] = w
        return w

    def _act(self, x: torch.Tensor, quantized: bool) -> torch.Tensor:
        if not quantized:
            return x.to(self.compute_dtype)
        return _numerics().fake_quantize(x.to(self.compute_dtype), self.mode, axis=-1).to(self.compute_dtype)

    def linear(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` for linear ``prefix`` (e.g. ``model.layers.0.self_attn.qkv_proj``): on-grid layers
        quantize the activation rowwise on the sampler's grid and use the dequantized bytes; GEMM in BF16."""
        name = prefix + ".weight"
        d = self.dests[name]
        return F.linear(self._act(x, d.quantized), self.weight(name)).to(x.dtype)

    def experts(
        self, layer: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        """Fused-MoE forward of layer ``layer``: x [T, H], top-k ids/weights [T, k] -> [T, H]."""
        p = f"model.layers.{layer}.mlp.experts"
        d13 = self.dests[f"{p}.w13_weight"]
        w13, w2 = self.weight(f"{p}.w13_weight"), self.weight(f"{p}.w2_weight")
        out = torch.zeros(x.shape, dtype=torch.float32)
        for e in torch.unique(topk_ids).tolist():
            tok, slot = torch.where(topk_ids == e)
            gate, up = F.linear(self._act(x[tok], d13.quantized), w13[e]).chunk(2, dim=-1)
            h = F.silu(gate) * up
            y = F.linear(self._act(h, d13.quantized), w2[e]).float()
            out.index_add_(0, tok, y * topk_weights[tok, slot, None].float())
        return out.to(x.dtype)
