"""Pick the engines by name: ``--sampler-engine native|vllm`` and ``--learner-engine native|megatron``.

=================  ==========================================  ==============================================
name               engine                                      needs
=================  ==========================================  ==============================================
sampler native     ``pipeline.sampler.engine.Sampler``                nothing extra
sampler vllm       ``pipeline.engines.vllm.client.VllmSampler``  ``.venv-vllm`` (``make vllm``): vLLM runs in its
                   (vLLM in its own process)                   own process with that venv's python
learner native     ``pipeline.learner.engine.HFLearner``              nothing extra
learner megatron   ``pipeline.engines.megatron.learner``       ``megatron-core`` in this venv; dense presets
                   ``.MegatronLearner``                        only; on CPU the local spec (``mxfp8``
                                                               emulated); on CUDA the TE spec (``mxfp8``
                                                               needs SM 10.x; no TE: refused)
=================  ==========================================  ==============================================

Both factories return objects satisfying ``pipeline.interfaces.SamplerEngine`` / ``LearnerBackend``, so the loop
runs them unchanged. A missing package or unsupported hardware is an ``EngineUnavailableError`` (an
``InputError``: the CLI prints one line and exits 2) naming what is missing and how to get it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from tracing.outputs.errors import InputError

SAMPLER_ENGINES = ("native", "vllm")
LEARNER_ENGINES = ("native", "megatron")


class EngineUnavailableError(InputError):
    """The requested engine cannot run here (package or hardware missing)."""


def make_sampler_engine(
    name: str,
    *,
    config: Any,
    mode: str = "bf16",
    eos_id: int = 1,
    pad_id: int = 0,
    **kwargs: Any,
) -> Any:
    """A ``SamplerEngine`` called ``name`` for the HF ``config``. ``kwargs`` go to the engine (native:
    grid_fraction, kv_cache, prefix_cache, calibration_prompts; vllm: python, max_model_len, seed, ...)."""
    if name == "native":
        from pipeline.sampler.engine import Sampler

        return Sampler(config, mode, eos_id=eos_id, pad_id=pad_id, **kwargs)
    if name == "vllm":
        from pipeline.engines.vllm.client import VllmSampler, VllmUnavailableError

        _drop_native_options(kwargs)
        try:
            return VllmSampler(config, mode, eos_id=eos_id, **kwargs)
        except VllmUnavailableError as exc:
            raise EngineUnavailableError(str(exc)) from None
    raise InputError(f"unknown sampler engine {name!r}; choose one of {', '.join(SAMPLER_ENGINES)}")


def _drop_native_options(kwargs: dict[str, Any]) -> None:
    """Native-sampler options vLLM does not take: refuse the ones that would change results, drop the rest
    (``device``: vLLM runs in its own process on the device its build targets)."""
    kwargs.pop("device", None)
    if float(kwargs.pop("grid_fraction", 1.0)) != 1.0:
        raise EngineUnavailableError("--sampler-engine vllm supports --grid-fraction 1 only")
    if kwargs.pop("kv_cache", "bf16") != "bf16":
        raise EngineUnavailableError(
            "--sampler-engine vllm: --kv-cache fp8 is not wired (vLLM's own FP8 KV cache)"
        )
    if not kwargs.pop("prefix_cache", True):
        raise EngineUnavailableError("--sampler-engine vllm always runs with vLLM's prefix cache on")
    kwargs.pop("calibration_prompts", None)  # FP8 KV-cache calibration: native sampler only
    kwargs.pop("pad_id", None)


def make_sync_and_checker(sampler_engine: str, learner_engine: str) -> tuple[Any, Any]:
    """(``WeightSync``, checker) for ``RLLoop(syncer=..., checker=...)`` for this pair of engines.

    vLLM: the weight-only-grid sync decision and I1 (``pipeline.engines.vllm.checks``); Megatron: the export
    check folded into I3 (``pipeline.engines.megatron.checks``); native + native: the defaults."""
    from pipeline.sync.invariants import check_sync
    from pipeline.sync.weight_sync import WeightSync

    syncer: Any = WeightSync()
    base: Any = check_sync
    if sampler_engine == "vllm":
        from pipeline.engines.vllm.checks import check_sync_vllm, make_vllm_weight_sync

        syncer, base = make_vllm_weight_sync(), check_sync_vllm
    if learner_engine != "megatron":
        return syncer, base

    def checker(step: int, learner: Any, engine: Any, **kw: Any) -> list[Any]:
        from pipeline.engines.megatron.checks import fold_export_check

        return fold_export_check(base(step, learner, engine, **kw), learner)

    return syncer, checker


def make_learner_backend(
    name: str,
    *,
    model: Any,
    preset: Any,
    precision: str = "bf16",
    **kwargs: Any,
) -> Any:
    """A ``LearnerBackend`` called ``name`` starting from HF ``model``'s weights (the Megatron learner copies
    them into its own layout, so both engines start from identical weights). ``kwargs`` (compute_dtype,
    config, ranges, ...) go to the learner."""
    if name == "native":
        from pipeline.learner.engine import HFLearner

        return HFLearner(model, precision, **kwargs)
    if name == "megatron":
        device = kwargs.pop("device", None)
        gemm, cast = kwargs.pop("gemm", "auto"), kwargs.pop("weight_cast", "per-step")
        if (gemm, cast) != ("auto", "per-step"):
            raise EngineUnavailableError(
                "--gemm and --weight-cast apply to the native learner; the Megatron learner runs TE's recipe "
                "on a GPU and its emulated MXFP8 linears on the CPU"
            )
        if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
            raise EngineUnavailableError(
                "--learner-engine megatron needs megatron-core: .venv/bin/pip install -c constraints.txt megatron-core"
            )
        if preset.is_moe:
            raise EngineUnavailableError(
                f"--learner-engine megatron supports dense presets only; {preset.name!r} is MoE (use tiny-dense)"
            )
        from pipeline.device import HardwareUnavailableError

        try:
            from pipeline.engines.megatron.learner import MegatronLearner

            hf_init = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
            learner = MegatronLearner(preset, precision, hf_init=hf_init, **kwargs)
        except HardwareUnavailableError as exc:
            raise EngineUnavailableError(
                f"--learner-engine megatron --precision {precision}: {exc}"
            ) from None
        if device is not None and learner.device.type != getattr(device, "type", str(device)):
            raise EngineUnavailableError(
                f"--learner-engine megatron runs on {learner.device} here (CUDA with Transformer Engine, else "
                f"the CPU), not on --device {device}; pass --device {learner.device.type}"
            )
        return learner
    raise InputError(f"unknown learner engine {name!r}; choose one of {', '.join(LEARNER_ENGINES)}")
