"""The GPU path of the Megatron learner: Transformer Engine layer spec, ``MXFP8BlockScaling``, TE's own bytes.

Which path runs (``select_learner_path``, a pure function of the hardware it is told about):

==========================  =========  ==================================================================
machine                     precision  path
==========================  =========  ==================================================================
no CUDA                     bf16       local spec, CPU (``compat.py``)
no CUDA                     mxfp8      local spec with mxperf's emulated MXFP8 linears (``mxfp8_spec.py``)
CUDA, SM >= 10.0 + TE       mxfp8      TE spec, forward under ``te.autocast(recipe=MXFP8BlockScaling())``
CUDA, any SM + TE           bf16       TE spec, plain BF16 (no autocast)
CUDA, SM < 10.0 (Hopper)    mxfp8      refused: no MXFP8 tensor cores (use fp8-tensor / fp8-rowwise)
CUDA without TE             any        refused: names the package to install
==========================  =========  ==================================================================

A Hopper run is never labelled ``mxfp8``: TE's MXFP8 kernels are guarded by ``__CUDA_ARCH__ >= 1000``.

The TE spec fuses each pre-norm into the next linear (``TELayerNormColumnParallelLinear``): the RMSNorm weight
before attention is ``linear_qkv.layer_norm_weight`` and the one before the MLP ``linear_fc1.layer_norm_weight``.
``te_to_local_names`` / ``local_to_te_names`` rename those two, so ``weights.py``'s Megatron <-> HF mapping (the
query-group interleave of ``linear_qkv``, [gate; up] of ``linear_fc1``) is reused unchanged.

Weight export (the sync's I1 bytes): for each TE linear, ``MXFP8Quantizer(E4M3, rowwise=True,
columnwise=False)(weight)`` -- the same rowwise quantization TE's fprop applies to the same BF16 weight -- gives
``_rowwise_data`` uint8 [N, K] and ``_rowwise_scale_inv`` uint8 padded to (roundup(N, 128), roundup(K/32, 4)),
whose padding is uninitialised memory. ``compact_rowwise`` keeps exactly ``[:N, :K/32]`` (unswizzling first when
the quantizer produced GEMM-swizzled scales). Row permutations commute with rowwise 1x32 blocks along K, so the
fused-name split of ``weights.megatron_to_hf`` moves whole rows of bytes and scales.

Weight casts (``refresh_weight_casts``). Megatron's TE linears pass ``is_first_microbatch`` to TE: True on a
module's first forward, False on every later one, and with False TE reuses the weight cast it made last time
(``get_weight_workspace(update_workspace=is_first_microbatch)``). Megatron's schedules set it back to True at
each step's first micro-batch (``MegatronModule.set_is_first_microbatch``, a no-op unless ``config.fp8`` is
set -- and mxperf enters ``te.autocast`` itself, leaving ``config.fp8`` unset). So after every weight change
(optimizer step, weight load) the learner must call ``refresh_weight_casts(model)`` before the next MXFP8
forward, or that forward multiplies by the MXFP8 weights of the very first forward.

Status: written against megatron-core 0.16 and TE >= 2.13 API names; **never run on hardware** (no Blackwell
GPU was available to the session that wrote it). Everything but the CUDA calls is tested on CPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.device import HardwareUnavailableError

MXFP8_MIN_CAPABILITY = (10, 0)
TE_INSTALL = (
    "pip install 'transformer-engine[pytorch]>=2.13' on a CUDA machine (the 'gpu' extra: mxperf[gpu])"
)
MXFP8_TOKEN_MULTIPLE = (
    32  # TE's MXFP8 quantizer needs prod(shape[:-1]) % 32 == 0 (wgrad blocks run along tokens)
)
SCALE_ROW_TILE, SCALE_COL_TILE = 128, 4  # TE's padded / swizzled scale tile (rows x scale columns)
_TE_NORM_RENAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}


@dataclass(frozen=True)
class LearnerPath:
    """What the learner builds: ``spec`` "local" | "transformer_engine", ``recipe`` None | "MXFP8BlockScaling",
    ``device`` "cpu" | "cuda", and a one-line ``label`` for the run manifest."""

    precision: str
    spec: str
    recipe: str | None
    device: str
    label: str

    @property
    def uses_te(self) -> bool:
        return self.spec == "transformer_engine"


def select_learner_path(
    precision: str,
    capability: tuple[int, int] | None,
    device_name: str | None = None,
    te_error: str | None = None,
) -> LearnerPath:
    """The learner path for ``precision`` on a machine with CUDA ``capability`` (None: no CUDA device) named
    ``device_name``; ``te_error`` is why Transformer Engine failed to import (None: it imports). Pure: the
    caller probes the hardware. Raises ``HardwareUnavailableError`` where no honest path exists."""
    if precision not in ("bf16", "mxfp8"):
        raise ValueError(f"no Megatron learner path for precision {precision!r}; choose bf16 or mxfp8")
    if capability is None:
        gemm = "emulated MXFP8 linears" if precision == "mxfp8" else "BF16"
        return LearnerPath(precision, "local", None, "cpu", f"megatron local spec, CPU, {gemm}")
    gpu = f"{device_name or 'CUDA device'} (SM {capability[0]}.{capability[1]})"
    if precision == "mxfp8" and tuple(capability) < MXFP8_MIN_CAPABILITY:
        raise HardwareUnavailableError(
            f"mxfp8 training needs MXFP8 tensor cores (SM 10.x, Blackwell); {gpu} has none. On Hopper use "
            "fp8-tensor or fp8-rowwise (torch._scaled_mm) instead; this run is not labelled mxfp8"
        )
    if te_error is not None:
        raise HardwareUnavailableError(
            f"the Megatron learner on {gpu} needs Transformer Engine ({te_error}); {TE_INSTALL}"
        )
    if precision == "mxfp8":
        return LearnerPath(
            precision, "transformer_engine", "MXFP8BlockScaling", "cuda", f"megatron TE spec, {gpu}, MXFP8"
        )
    return LearnerPath(precision, "transformer_engine", None, "cuda", f"megatron TE spec, {gpu}, BF16")


def probe_learner_path(precision: str) -> LearnerPath:
    """``select_learner_path`` for this machine. TE is imported only when a CUDA device is present (on a
    CPU-only install it is neither needed nor importable)."""
    from pipeline.device import cuda_capability

    cap = cuda_capability()
    if cap is None:
        return select_learner_path(precision, None)
    te_error = None
    try:
        import transformer_engine.pytorch  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:
        te_error = f"{type(exc).__name__}: {exc}"
    return select_learner_path(precision, cap, torch.cuda.get_device_name(0), te_error)


# -- build ----------------------------------------------------------------------------------------------------
def te_layer_spec() -> Any:
    """Megatron's TE GPT layer spec (qk-layernorm) with an ``arbitrary`` attention mask, so the explicit
    causal-and-padding mask of ``model.masks_and_positions`` is honoured (the default ``causal`` type would
    ignore it and let left-padded rows attend to padding)."""
    import dataclasses

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer.enums import AttnMaskType

    spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=True)
    attn = dataclasses.replace(
        spec.submodules.self_attention, params={"attn_mask_type": AttnMaskType.arbitrary}
    )
    return dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, self_attention=attn))


def require_te_autocast(te: Any) -> Any:
    """TE's ``autocast`` (TE >= 2.13; ``fp8_autocast`` is the deprecated name of older releases)."""
    autocast = getattr(te, "autocast", None)
    if autocast is None:
        raise HardwareUnavailableError(f"Transformer Engine too old (no te.autocast); {TE_INSTALL}")
    return autocast


@contextlib.contextmanager
def fprop_context(path: LearnerPath) -> Iterator[None]:
    """The forward's precision context: ``te.autocast(enabled=True, recipe=MXFP8BlockScaling())`` for the TE
    MXFP8 path, nothing otherwise (BF16 parameters; CPU emulation quantizes inside its own linears)."""
    if path.recipe != "MXFP8BlockScaling":
        yield
        return
    from pipeline.device import require_te_mxfp8

    te, recipe = require_te_mxfp8()
    with require_te_autocast(te)(enabled=True, recipe=recipe):
        yield


def refresh_weight_casts(model: Any) -> int:
    """Make every module with TE's ``is_first_microbatch`` flag re-quantize its weights on its next forward (the
    reset Megatron's schedules do per step; see the module docstring). Returns how many modules were reset."""
    modules = [m for m in model.modules() if hasattr(m, "is_first_microbatch")]
    for m in modules:
        m.is_first_microbatch = True
    return len(modules)


def pad_tokens(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, multiple: int = MXFP8_TOKEN_MULTIPLE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad [B, T] to T' with B*T' a multiple of ``multiple`` (masked tokens, id 0). Causal attention means
    real tokens never see them, so log-probs of the first T positions are unchanged; slice logits to T."""
    b, t = input_ids.shape
    new_t = t
    while (b * new_t) % multiple:
        new_t += 1
    if new_t == t:
        return input_ids, attention_mask
    pad = (0, new_t - t)
    return torch.nn.functional.pad(input_ids, pad), torch.nn.functional.pad(attention_mask, pad)


# -- names ----------------------------------------------------------------------------------------------------
def te_to_local_names(state: dict[str, Any]) -> dict[str, Any]:
    """Rename TE's fused pre-norm weights to the local spec's names (other names pass through unchanged)."""
    out: dict[str, Any] = {}
    for name, value in state.items():
        for te_suffix, local_suffix in _TE_NORM_RENAMES.items():
            if name.endswith("." + te_suffix):
                name = name[: -len(te_suffix)] + local_suffix
                break
        out[name] = value
    return out


def local_to_te_names(state: dict[str, Any]) -> dict[str, Any]:
    """Inverse of ``te_to_local_names`` (to load HF weights into a TE-spec model)."""
    out: dict[str, Any] = {}
    for name, value in state.items():
        for te_suffix, local_suffix in _TE_NORM_RENAMES.items():
            if name.endswith("." + local_suffix) and name.startswith("decoder.layers."):
                name = name[: -len(local_suffix)] + te_suffix
                break
        out[name] = value
    return out


# -- bytes ----------------------------------------------------------------------------------------------------
def unswizzle_scales(swizzled: torch.Tensor, padded_rows: int, padded_cols: int) -> torch.Tensor:
    """GEMM-swizzled E8M0 scales -> the padded compact [padded_rows, padded_cols] layout. In each 128 x 4 tile
    (tiles row-major), row r, scale column c sits at byte (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4."""
    mt, kt = padded_rows // SCALE_ROW_TILE, padded_cols // SCALE_COL_TILE
    tiles = swizzled.reshape(mt, kt, 32, 4, SCALE_COL_TILE)  # (tile row, tile col, r % 32, r // 32, c % 4)
    return tiles.permute(0, 3, 2, 1, 4).reshape(padded_rows, padded_cols)


def compact_rowwise(qt: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(bytes uint8 [N, K], E8M0 scales uint8 [N, K/32]) of a TE ``MXFP8Tensor`` (rowwise usage), read from
    TE's storage fields. Only ``[:N, :K/32]`` of the padded scale is kept: the rest is garbage."""
    data = qt._rowwise_data
    scale = qt._rowwise_scale_inv
    if data is None or scale is None:
        raise ValueError("the MXFP8 tensor has no rowwise data (quantize with rowwise=True)")
    n, k = data.shape[-2], data.shape[-1]
    if k % 32:
        raise ValueError(f"MXFP8 rowwise quantization needs K % 32 == 0; got a [{n}, {k}] weight")
    rows = -(-n // SCALE_ROW_TILE) * SCALE_ROW_TILE
    cols = -(-(k // 32) // SCALE_COL_TILE) * SCALE_COL_TILE
    if scale.numel() != rows * cols:
        raise ValueError(
            f"rowwise scale has {scale.numel()} bytes; TE pads [{n}, {k // 32}] to [{rows}, {cols}]"
        )
    if getattr(qt, "_with_gemm_swizzled_scales", False):
        scale = unswizzle_scales(scale, rows, cols)
    scale = scale.reshape(rows, cols)
    return data.view(torch.uint8).reshape(n, k), scale[:n, : k // 32].contiguous()


def te_mxfp8_linear_weights(model: Any) -> dict[str, Any]:
    """Megatron parameter name (``...linear_qkv.weight``) -> ``pipeline.quant.MXFP8Tensor`` holding TE's own
    rowwise bytes + compact E8M0 scales for the weight of every TE linear in ``model`` (what fprop multiplies
    by under ``MXFP8BlockScaling``). Needs TE and an SM 10.x GPU."""
    from pipeline.device import require_te_mxfp8

    te, _ = require_te_mxfp8()
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

    from pipeline.quant import MXFP8Tensor

    quantizer = MXFP8Quantizer(fp8_dtype=tex.DType.kFloat8E4M3, rowwise=True, columnwise=False)
    linears = (te.Linear, te.LayerNormLinear)
    out: dict[str, Any] = {}
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, linears):
                data, scale = compact_rowwise(quantizer(mod.weight.detach()))
                out[f"{name}.weight"] = MXFP8Tensor(data.cpu(), scale.cpu(), -1, "te", mod.weight.dtype)
    return out
