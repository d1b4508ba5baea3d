"""The sampler's own weight store, laid out as vLLM holds a Qwen3 model, loaded from sync bytes.

A rollout engine does not hold the learner's tensors. It holds **its own layout** (vLLM
``model_executor/models/qwen3.py`` / ``qwen3_moe.py``; :mod:`pipeline.sampler.layout`: fused qkv_proj and
gate_up_proj, MoE w13/w2) and fills it from a checkpoint-named stream, piece by piece. Fusing is
concatenation along N, which commutes with *rowwise* quantization (1x32 blocks along K; notes 2.3), so
MXFP8 bytes and scales are copied piece by piece.

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

Coverage. Every load counts the writes to each destination row (and scale row) and stamps each row with the
payload's version; :meth:`load_record` exposes them to the invariant checker (I2, I7). A load that leaves a
row unwritten, writes one twice, or carries a name that maps nowhere raises :class:`IncompleteLoadError`
and poisons the store: a failed sync is fail-stop, the engine refuses to compute until a complete load.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from pipeline.interfaces import scale_name
from pipeline.sampler.grids import (
    _numerics,
    dequantize_derived,
    dequantize_sent,
    derive_scale,
    quantize_to_grid,
)
from pipeline.sampler.layout import (  # noqa: F401  (re-exported: the store's public vocabulary)
    MX_RULES,
    SAMPLER_MODES,
    DestSpec,
    Piece,
    SamplerLayout,
    _index,
    check_mode,
    default_is_quantized,
    derived_name,
    grid_layers,
    layer_of,
    sampler_layout,
)

E4M3_NAN_BYTE = 0x7F
E8M0_NAN_BYTE = 0xFF


def row_index(piece: Piece) -> tuple[Any, ...]:
    """Index of the destination rows (of the write counters) a piece writes: its rows / expert, or all."""
    return (
        _index(piece.expert, piece.dst_rows) if piece.dst_rows or piece.expert is not None else (slice(None),)
    )


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

    def next_load(self, version: int, dests: Iterable[DestSpec], *, scales: bool) -> LoadRecord:
        """A fresh record for the load of ``version``: zero write counters per destination row (and scale
        row with ``scales``), row versions carried over from this record (rows a load skips keep theirs)."""
        rec = LoadRecord(version, {}, {}, dict(self.derived_versions))
        for d in dests:
            rows = tuple(d.shape[:-1]) if len(d.shape) >= 2 else (1,)
            rec.writes[d.name] = torch.zeros(rows, dtype=torch.int32)
            prev = self.row_versions.get(d.name)
            rec.row_versions[d.name] = (
                prev.clone() if prev is not None else torch.full(rows, -1, dtype=torch.int64)
            )
            if scales and d.quantized:
                rec.writes[d.scale] = torch.zeros(rows, dtype=torch.int32)
        return rec


class SamplerWeights:
    """The sampler's weights in vLLM layout (see the module docstring), the only copy its kernels read."""

    def __init__(
        self, config: Any, mode: str, grid_fraction: float = 1.0, policy: Any = None, device: Any = None
    ) -> None:
        self.config = config
        self.device = torch.device(device if device is not None else "cpu")
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
                self._store[d.name] = torch.full(
                    d.shape, E4M3_NAN_BYTE, dtype=torch.uint8, device=self.device
                )
                self._store[d.scale] = self._nan_scale(d)
                self._store[d.derived] = derive_scale(self.mode, self._store[d.scale], d.shape)
            else:
                self._store[d.name] = torch.full(
                    d.shape, float("nan"), dtype=torch.bfloat16, device=self.device
                )

    def _nan_scale(self, d: DestSpec) -> torch.Tensor:
        probe = torch.zeros(d.shape[-2:], dtype=torch.bfloat16)
        _, s = quantize_to_grid(probe, self.mode)
        shape = (d.shape[0], *s.shape) if len(d.shape) == 3 else tuple(s.shape)
        if s.dtype == torch.uint8:
            return torch.full(shape, E8M0_NAN_BYTE, dtype=torch.uint8, device=self.device)
        return torch.full(shape, float("nan"), dtype=s.dtype, device=self.device)

    # -- loading ----------------------------------------------------------------------------------------------
    def load_weights(self, payload: bytes) -> LoadRecord:
        """Load one full weight push (safetensors bytes from ``pipeline.sync.weight_sync.pack_weights``)."""
        from pipeline.interfaces import unpack_weights

        tensors, meta = unpack_weights(payload)
        tensors = {k: v.to(self.device) for k, v in tensors.items()}  # one host -> device copy per tensor
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
        self._record = self._record.next_load(version, self.dests.values(), scales=True)

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
                self._staging[d.name] = torch.full(
                    d.shape, float("nan"), dtype=torch.bfloat16, device=self.device
                )
            self._staging[d.name][dst] = value.to(torch.bfloat16)
        else:
            target = self._store[d.name]
            target[dst] = value.to(torch.bfloat16).reshape(target[dst].shape)
        self._mark(piece)

    @staticmethod
    def _row_index(piece: Piece) -> tuple[Any, ...]:
        return row_index(piece)

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
        """Host copies of every stored tensor: weights, bytes, scales and derived copies, in sampler names."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self._store.items()}

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
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in torch.unique(topk_ids).tolist():
            tok, slot = torch.where(topk_ids == e)
            gate, up = F.linear(self._act(x[tok], d13.quantized), w13[e]).chunk(2, dim=-1)
            h = F.silu(gate) * up
            y = F.linear(self._act(h, d13.quantized), w2[e]).float()
            out.index_add_(0, tok, y * topk_weights[tok, slot, None].float())
        return out.to(x.dtype)
