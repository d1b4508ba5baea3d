"""The HF-transformers learner: full-sequence log-probs, GRPO updates over micro-batches, weight export.

Precision. Master weights and AdamW state are float32 on the learner's device. The forward runs in
``compute_dtype`` (bfloat16 by default, via CPU/CUDA autocast, as Megatron's mixed precision does). With a
low-precision id (``LEARNER_PRECISIONS``) every linear layer the precision policy selects is replaced by a
quantized linear (``pipeline.quant``): fprop, dgrad and wgrad on operands quantized on that grid, through
``torch._scaled_mm`` where the device has the kernel and the emulation (exact bytes) elsewhere -- ``gemm_backend``
says which, ``gemm_reason`` why; embeddings, norms, router and LM head stay BF16 (notes section 2.5).
``weight_cast`` chooses when weight casts are redone (``per-step``: once per optimizer step, in micro-batch 0;
``per-microbatch``: every micro-batch). ``export_weights`` hands out **the exact fprop bytes and scales**
(what the sampler must hold to be on the learner's grid).

Instrumentation: each micro-batch of ``train_step`` is an ``update/microbatch`` range with attributes
step, microbatch, tokens (real), padded_tokens, precision; its peak memory is recorded (CUDA: max allocated;
CPU: the bytes autograd holds for backward at the end of the forward, where activations peak; see
``_MemProbe``). On CUDA the range synchronizes before it closes, so its time holds its own kernels.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pipeline.interfaces import scale_name
from pipeline.learner.grpo import (
    GRPOBatch,
    GRPOConfig,
    StepTotals,
    microbatch_range,
    pack_microbatches,
    token_loss,
)
from tracing.capture.ranges import RangeLog
from tracing.outputs.errors import InputError

LEARNER_PRECISIONS = ("bf16", "mxfp8", "fp8-tensor", "fp8-rowwise", "fp8-block128")
COMPUTE_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def check_learner_settings(
    precision: str, compute_dtype: str, precisions: tuple[str, ...] = LEARNER_PRECISIONS
) -> None:
    """InputError naming the valid choices for an unknown learner precision or compute dtype."""
    if precision not in precisions:
        raise InputError(f"unknown learner precision {precision!r}; choose one of {', '.join(precisions)}")
    if compute_dtype not in COMPUTE_DTYPES:
        raise InputError(
            f"unknown compute dtype {compute_dtype!r}; choose one of {', '.join(COMPUTE_DTYPES)}"
        )


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class _MemProbe:
    """Peak memory of one micro-batch.

    CUDA: ``max_memory_allocated`` growth over the micro-batch. CPU: the bytes of the distinct tensor
    storages autograd saves for backward during the forward (parameters excluded) -- the activation
    memory, which peaks at the end of the forward and grows with tokens. The process RSS cannot show it
    after the first micro-batch because the allocator reuses freed pages (its growth is kept as
    ``rss_delta_bytes`` for reference).
    """

    def __init__(self, device: torch.device, params: Iterator[torch.Tensor]) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        self._saved: dict[int, int] = {}
        self.start = 0
        self.rss_start = 0

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._param_ptrs:
            self._saved[ptr] = storage.nbytes()
        return t

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """Wrap the forward: records what autograd keeps for backward (CPU)."""
        self._saved = {}
        self.rss_start = _rss_bytes()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
            yield
            return
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield

    def result(self) -> tuple[float, float]:
        """(peak bytes, RSS growth bytes) of the micro-batch, read after its backward."""
        rss = float(max(0, _rss_bytes() - self.rss_start))
        if self.cuda:  # wait for the backward kernels: the peak is theirs, and so is the range's time
            torch.cuda.synchronize(self.device)
            return float(torch.cuda.max_memory_allocated(self.device) - self.start), rss
        return float(sum(self._saved.values())), rss


class HFLearner:
    """A :class:`pipeline.interfaces.LearnerBackend` over a transformers causal LM."""

    def __init__(
        self,
        model: torch.nn.Module,
        precision: str = "bf16",
        *,
        compute_dtype: str = "bfloat16",
        config: GRPOConfig | None = None,
        ranges: RangeLog | None = None,
        bf16_first_layers: int = 0,
        bf16_last_layers: int = 0,
        device: Any = None,
        gemm: str = "auto",
        weight_cast: str = "per-step",
    ) -> None:
        """``device``: where the model, the optimizer state and every GEMM live (default: the model's);
        ``gemm``: ``auto`` (the real kernel where the device has it), ``emulated`` or ``scaled_mm``."""
        from pipeline.device import HardwareUnavailableError
        from pipeline.quant import CastSchedule, PrecisionPolicy, convert_linears
        from pipeline.quant.gemm import choose_backend

        check_learner_settings(precision, compute_dtype)
        self.model = model if device is None else model.to(device)
        self.precision = precision
        self.compute_dtype = compute_dtype
        self.config = config or GRPOConfig()
        self.ranges = ranges or RangeLog()
        self.device = next(self.model.parameters()).device
        try:
            self.schedule = CastSchedule(weight_cast)
            self.gemm_backend, self.gemm_reason = choose_backend(precision, self.device, gemm)
        except (ValueError, HardwareUnavailableError) as exc:
            raise InputError(str(exc)) from None
        # The BF16 baseline runs the same linears through the same GEMM code, unquantized (see convert_linears).
        policy = PrecisionPolicy(precision, bf16_first_layers, bf16_last_layers)
        backend = "emulated" if precision == "bf16" else self.gemm_backend
        options = {"backend": backend, "schedule": self.schedule, "baseline_gemms": True}
        dtype = COMPUTE_DTYPES[compute_dtype]
        self.quantized_modules: list[str] = list(convert_linears(self.model, policy, dtype, **options))
        self.optimizer = self.config.optimizer([p for p in self.model.parameters() if p.requires_grad])
        self.step_count = 0
        self.last_microbatches: list[dict[str, Any]] = []

    def describe(self) -> dict[str, Any]:
        """What manifests record about this learner: device, GEMM backend (and why), weight-cast schedule."""
        from pipeline.device import device_label
        from pipeline.quant.operands import COMPILE_FAILURES

        return {
            "learner_device": device_label(self.device),
            "precision": self.precision,
            "gemm_backend": self.gemm_backend,
            "gemm_reason": self.gemm_reason,
            "weight_cast": self.schedule.mode,
            "quantizer_compile_failures": dict(COMPILE_FAILURES),
        }

    # -- forward -----------------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.compute_dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=COMPUTE_DTYPES[self.compute_dtype])

    def _token_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Log-prob of each next token [B, T-1] from one full-sequence forward (no grad)."""
        self.model.eval()
        self.schedule.next_microbatch()
        with torch.no_grad():
            return self._token_logprobs(input_ids.to(self.device), attention_mask.to(self.device))

    # -- update ------------------------------------------------------------------------------------------
    def plan(self, batch: GRPOBatch, tokens_per_microbatch: int) -> list[list[int]]:
        return pack_microbatches(batch.lengths, tokens_per_microbatch)

    def train_step(self, batch: GRPOBatch, tokens_per_microbatch: int) -> dict[str, float]:
        """One AdamW step on ``batch``, accumulating gradients over packed micro-batches."""
        plan = self.plan(batch, tokens_per_microbatch)
        total_tokens = float(batch.response_mask.sum().clamp(min=1.0))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        probe = _MemProbe(self.device, self.model.parameters())
        totals = StepTotals()
        self.last_microbatches = []
        for i, rows in enumerate(plan):
            mb = batch.select(rows)
            with microbatch_range(self.ranges, self.step_count, i, mb, self.precision) as attrs:
                self.schedule.next_microbatch()  # per-microbatch weight casts happen inside this range
                with probe.forward():
                    lp = self._token_logprobs(mb.input_ids.to(self.device), mb.attention_mask.to(self.device))
                    per_token, stats = token_loss(lp, _to(mb, self.device), self.config)
                    loss = per_token.sum() / total_tokens
                loss.backward()
                peak, rss = probe.result()
                attrs["peak_mem_bytes"] = peak
                attrs["rss_delta_bytes"] = rss
            totals.add(loss, stats)
            self.last_microbatches.append(
                {"microbatch": i, "num_tokens": attrs["tokens"], "padded_tokens": attrs["padded_tokens"]}
                | {"peak_mem_bytes": peak}
            )
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm, foreach=False)
        self.optimizer.step()
        self.step_count += 1
        return totals.stats(batch, float(grad_norm))

    # -- export ------------------------------------------------------------------------------------------
    def _quantized_params(self) -> Iterator[tuple[str, Any]]:
        """(HF param name, MXFP8Tensor of its fprop bytes) for every quantized weight."""
        modules = dict(self.model.named_modules())
        for mod_name in self.quantized_modules:
            mod = modules[mod_name]
            if hasattr(mod, "quantized_weights"):  # fused MoE experts: several 3-D parameters
                for pname, q in mod.quantized_weights().items():
                    yield f"{mod_name}.{pname}", q
            else:
                yield f"{mod_name}.weight", mod.quantized_weight()

    def export_weights(self, send_quantized: Callable[[str], bool]) -> dict[str, torch.Tensor]:
        """Forward weights in HF names (see :class:`pipeline.interfaces.LearnerBackend`)."""
        out: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            quantized = {n: q for n, q in self._quantized_params() if send_quantized(n)}
            for name, p in self.model.named_parameters():
                if name in quantized:
                    out[name] = quantized[name].data.detach().cpu().contiguous().clone()
                    out[scale_name(name)] = quantized[name].scale.detach().cpu().contiguous().clone()
                else:
                    out[name] = p.detach().to(torch.bfloat16).cpu().contiguous().clone()
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def _to(batch: GRPOBatch, device: torch.device) -> GRPOBatch:
    if device.type == "cpu":
        return batch
    sl = batch.sampler_logprobs.to(device) if batch.sampler_logprobs is not None else None
    return GRPOBatch(
        batch.input_ids.to(device),
        batch.attention_mask.to(device),
        batch.response_mask.to(device),
        batch.advantages.to(device),
        batch.old_logprobs.to(device),
        sl,
    )
