"""``MegatronLearner``: the ``LearnerBackend`` protocol on a megatron-core GPTModel (Qwen3 shape).

Same GRPO as mxperf's HF learner (``pipeline.learner.grpo``: clipped token loss, TIS, token-mean over the step, packing
into micro-batches within a token budget), different engine: Megatron's own modules, layer spec and fused
weight layout. Weights leave through ``export_weights`` in HF names (``pipeline.engines.megatron.weights`` undoes
the query-group interleave of ``linear_qkv`` and splits ``linear_fc1`` into gate / up), so the weight sync and
invariant checks treat it exactly like the HF learner.

Precision (precision ids, docs/contracts.md):
- ``bf16`` on CPU: the model holds bf16 parameters (``TransformerConfig(bf16=True)``; forward and backward in
  bf16, as Megatron's Float16Module runs) and the optimizer fp32 master copies, as Megatron's mixed-precision
  optimizer does: micro-batch gradients accumulate in fp32 (Megatron's ``main_grad``), AdamW updates the
  masters, the bf16 parameters are refreshed from them. Exported tensors are the bf16 parameters, i.e. exactly
  what the learner's GEMMs multiply by. (``torch.autocast`` is not an option: Megatron's linear autograd
  functions are not autocast-aware and their backward mixes dtypes.)
- ``mxfp8`` on CPU: the local spec with mxperf's **emulated** MXFP8 linears in place of the
  four decoder linears (``mxfp8_spec.py``: Megatron's GEMM method ``_forward_impl`` replaced, TE operand usage
  in fprop / dgrad / wgrad, tensor-parallel size 1). ``export_weights`` then sends, for each quantized linear
  the sink asks for, the exact rowwise bytes + E8M0 scales of the fprop, split into HF names (rowwise blocks
  run along K, so the row permutation of the query-group interleave and the [gate; up] split move whole
  rows of bytes and scales).
- On a CUDA machine (``te_path.py``, never run on hardware yet): Transformer Engine's layer spec, forward under
  ``te.autocast(recipe=MXFP8BlockScaling())`` for ``mxfp8`` on SM 10.x (plain BF16 for ``bf16``), and the
  export sends TE's own rowwise bytes + compact scales. ``mxfp8`` on a GPU below SM 10.0 (Hopper) and any GPU
  run without TE are refused with ``HardwareUnavailableError``.

CPU caveat: megatron-core needs ``pipeline.engines.megatron.compat`` on CPU-only torch, which patches
process-wide ``torch.cuda`` functions; build this learner in a process of its own (the tests use a subprocess).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pipeline.engines.megatron.compat import apply_cpu_compat, init_single_process_group
from pipeline.engines.megatron.model import (
    attention_shape,
    build_gpt_model,
    forward_logits,
    load_hf_weights,
)
from pipeline.engines.megatron.te_path import (
    fprop_context,
    pad_tokens,
    probe_learner_path,
    refresh_weight_casts,
    te_layer_spec,
    te_mxfp8_linear_weights,
    te_to_local_names,
)
from pipeline.engines.megatron.weights import megatron_to_hf
from pipeline.interfaces import scale_name
from pipeline.learner.engine import COMPUTE_DTYPES, check_learner_settings
from pipeline.learner.grpo import (
    GRPOBatch,
    GRPOConfig,
    StepTotals,
    microbatch_range,
    pack_microbatches,
    token_loss,
)
from tracing.capture.ranges import RangeLog

SUPPORTED_PRECISIONS = ("bf16", "mxfp8")


def _next_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[:, j+1] | prefix) for j < T-1, in fp32: [B, T-1]."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


class MegatronLearner:
    """A Megatron-core GPTModel trained with GRPO; implements ``pipeline.interfaces.LearnerBackend``."""

    def __init__(
        self,
        preset: Any,
        precision: str = "bf16",
        *,
        seed: int = 0,
        compute_dtype: str = "bfloat16",
        config: GRPOConfig | None = None,
        ranges: RangeLog | None = None,
        hf_init: dict[str, torch.Tensor] | None = None,
        export_fault: str | None = None,
    ) -> None:
        """``hf_init``: an HF Qwen3 state dict to start from (e.g. the HF learner's model or a warm-started
        policy), so the Megatron and HF learners begin at identical weights; default: the HF init of
        ``preset`` at ``seed``. ``compute_dtype`` "float32" runs the model in fp32 (reference runs, tests).
        ``export_fault``: fault injection in the weight export (``weights.FAULTS``)."""
        check_learner_settings(precision, compute_dtype, SUPPORTED_PRECISIONS)
        self.path = probe_learner_path(precision)  # HardwareUnavailableError where no honest path exists
        self.device = torch.device(self.path.device)
        self.precision = precision
        self.preset = preset
        self.compute_dtype = compute_dtype
        self.config = config or GRPOConfig()
        self.ranges = ranges or RangeLog()
        self.export_fault = export_fault
        self.compat_patches = apply_cpu_compat()
        init_single_process_group()
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed)
        if hf_init is None:
            from pipeline.model.presets import build_model

            hf_init = build_model(preset, seed=seed).state_dict()
        dtype = COMPUTE_DTYPES[compute_dtype]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            te_spec = te_layer_spec() if self.path.uses_te else None
            fp32_model = build_gpt_model(preset, dtype=torch.float32, layer_spec=te_spec)
            # Float16Module casts the whole module, norms included (the local spec keeps norm weights fp32).
            spec = te_spec
            if precision == "mxfp8" and not self.path.uses_te:
                from pipeline.engines.megatron.mxfp8_spec import mxfp8_local_layer_spec

                spec = mxfp8_local_layer_spec()
            self.model = build_gpt_model(preset, dtype=dtype, layer_spec=spec).to(self.device, dtype)
        load_hf_weights(fp32_model, hf_init, preset)
        fp32_model.to(self.device)
        self._names = [n for n, _ in fp32_model.named_parameters()]
        self.master = [p.detach().clone().requires_grad_(True) for p in fp32_model.parameters()]
        del fp32_model
        self._copy_master_to_model()
        self.model.eval()  # no dropout anywhere; eval() also keeps the forward deterministic
        self.optimizer = self.config.optimizer(self.master)
        self.step_count = 0
        self.last_microbatches: list[dict[str, Any]] = []

    # -- forward -----------------------------------------------------------------------------------------
    def _copy_master_to_model(self) -> None:
        with torch.no_grad():
            for p, m in zip(self.model.parameters(), self.master, strict=True):
                p.copy_(m)
        refresh_weight_casts(self.model)  # TE: re-quantize the new weights on the next forward (te_path)

    def _forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] on the model's device, in its precision context (TE MXFP8: tokens padded to 32)."""
        t = input_ids.shape[1]
        ids, mask = input_ids.to(self.device), attention_mask.to(self.device)
        if self.path.recipe is not None:
            ids, mask = pad_tokens(ids, mask)
        with fprop_context(self.path):
            return forward_logits(self.model, ids, mask)[:, :t]

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] in fp32 on the CPU (computed in the model dtype), no gradient."""
        with torch.no_grad():
            return self._forward(input_ids, attention_mask).float().cpu()

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Per-token log-prob of each next token, [B, T-1], full-sequence forward, no gradient."""
        return _next_token_logprobs(self.logits(input_ids, attention_mask), input_ids)

    # -- update ------------------------------------------------------------------------------------------
    def plan(self, batch: GRPOBatch, tokens_per_microbatch: int) -> list[list[int]]:
        return pack_microbatches(batch.lengths, tokens_per_microbatch)

    def train_step(self, batch: GRPOBatch, tokens_per_microbatch: int) -> dict[str, float]:
        """One AdamW step: micro-batches packed within the token budget, loss = token mean over the step."""
        plan = self.plan(batch, tokens_per_microbatch)
        total_tokens = float(batch.response_mask.sum().clamp(min=1.0))
        self.optimizer.zero_grad(set_to_none=True)
        for m in self.master:
            m.grad = torch.zeros_like(m)
        self.model.train()
        totals = StepTotals()
        self.last_microbatches = []
        for i, rows in enumerate(plan):
            mb = batch.select(rows)
            with microbatch_range(self.ranges, self.step_count, i, mb, self.precision) as attrs:
                logits = self._forward(mb.input_ids, mb.attention_mask)
                logprobs = _next_token_logprobs(logits, mb.input_ids.to(self.device)).cpu()
                per_token, stats = token_loss(logprobs, mb, self.config)
                loss = per_token.sum() / total_tokens
                loss.backward()
                self._accumulate_main_grads()
                if self.device.type == "cuda":  # the range's time includes its own backward kernels
                    torch.cuda.synchronize(self.device)
            totals.add(loss, stats)
            self.last_microbatches.append(
                {"microbatch": i, "num_tokens": attrs["tokens"], "padded_tokens": attrs["padded_tokens"]}
            )
        grad_norm = torch.nn.utils.clip_grad_norm_(self.master, self.config.max_grad_norm, foreach=False)
        self.optimizer.step()
        self._copy_master_to_model()
        self.model.eval()
        self.step_count += 1
        return totals.stats(batch, float(grad_norm))

    def _accumulate_main_grads(self) -> None:
        """Move this micro-batch's parameter gradients into the fp32 master gradients (Megatron's main_grad)."""
        for p, m in zip(self.model.parameters(), self.master, strict=True):
            if p.grad is not None:
                m.grad.add_(p.grad.float())
                p.grad = None

    # -- export ------------------------------------------------------------------------------------------
    def hf_state_dict(self, *, master: bool = False) -> dict[str, torch.Tensor]:
        """Weights in HF names / layouts (through the export mapping, with any fault): the parameters the
        forward uses, or with ``master`` the fp32 master copies."""
        if master:
            own = {n: m.detach() for n, m in zip(self._names, self.master, strict=True)}
        else:
            own = {
                k: v.detach() for k, v in self.model.state_dict().items() if not k.endswith("._extra_state")
            }
        own = {k: v.cpu() for k, v in te_to_local_names(own).items()}
        return megatron_to_hf(own, attention_shape(self.preset), fault=self.export_fault)

    def export_weights(self, send_quantized: Callable[[str], bool]) -> dict[str, torch.Tensor]:
        """HF-named forward weights: BF16 values of the master weights, except, for an ``mxfp8`` learner, each
        quantized linear with ``send_quantized(hf_name)`` true, sent as its fprop bytes + E8M0 scales."""
        out = {
            k: v.to(torch.bfloat16).contiguous().clone() for k, v in self.hf_state_dict(master=True).items()
        }
        if self.precision != "mxfp8":
            return out
        if self.path.uses_te:
            q = te_mxfp8_linear_weights(self.model)  # TE's own rowwise bytes, compact [:N, :K/32] scales
        else:
            from pipeline.engines.megatron.mxfp8_spec import quantized_linears

            q = quantized_linears(self.model)
        shape = attention_shape(self.preset)
        data = megatron_to_hf({k: t.data for k, t in q.items()}, shape, fault=self.export_fault)
        scales = megatron_to_hf({k: t.scale for k, t in q.items()}, shape, fault=self.export_fault)
        for name, d in data.items():
            if send_quantized(name):
                out[name] = d.contiguous().clone()
                out[scale_name(name)] = scales[name].contiguous().clone()
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        """fp32 master weights in HF names (the learner's own truth for I3-style comparisons)."""
        return {k: v.clone() for k, v in self.hf_state_dict(master=True).items()}
