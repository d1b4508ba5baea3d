"""Engine factory: names, clear errors for missing packages / hardware (no engine is started here)."""

from __future__ import annotations

import pytest

from pipeline.engines.factory import EngineUnavailableError, make_learner_backend, make_sampler_engine
from pipeline.interfaces import LearnerBackend, SamplerEngine
from pipeline.model.presets import build_config, build_model, get_preset
from tracing.outputs.errors import InputError


def test_native_engines_satisfy_the_protocols() -> None:
    preset = get_preset("tiny-dense")
    sampler = make_sampler_engine("native", config=build_config(preset), mode="bf16")
    learner = make_learner_backend("native", model=build_model(preset), preset=preset, precision="bf16")
    assert isinstance(sampler, SamplerEngine)
    assert isinstance(learner, LearnerBackend)
    sampler.close()


@pytest.mark.parametrize("kind", ["sampler", "learner"])
def test_unknown_engine_name_lists_the_choices(kind: str) -> None:
    preset = get_preset("tiny-dense")
    with pytest.raises(InputError, match="choose one of"):
        if kind == "sampler":
            make_sampler_engine("sglang", config=build_config(preset))
        else:
            make_learner_backend("deepspeed", model=None, preset=preset)


def test_vllm_without_its_venv_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("MXPERF_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(EngineUnavailableError, match=r"make_vllm_venv\.sh"):
        make_sampler_engine("vllm", config=build_config(get_preset("tiny-dense")))


def test_megatron_refuses_moe_presets_before_building_anything() -> None:
    preset = get_preset("tiny-moe")
    with pytest.raises(EngineUnavailableError, match="dense presets only"):
        make_learner_backend("megatron", model=None, preset=preset)


def test_vllm_sampler_mode_outside_the_cpu_build_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.engines.vllm.client import VllmSampler

    with pytest.raises(ValueError, match="mode must be one of"):
        VllmSampler(build_config(get_preset("tiny-dense")), "fp8-tensor")


def test_gpu_only_paths_fail_with_the_reason_on_cpu() -> None:
    import torch

    from pipeline.device import HardwareUnavailableError, require_scaled_mm, require_te_mxfp8

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(HardwareUnavailableError, match="needs a CUDA GPU"):
        require_te_mxfp8()
    for precision in ("fp8-tensor", "fp8-rowwise", "fp8-block128", "mxfp8"):
        with pytest.raises(HardwareUnavailableError, match=f"{precision}.*no CUDA device"):
            require_scaled_mm(precision)
    with pytest.raises(ValueError, match=r"no torch\._scaled_mm path"):
        require_scaled_mm("mxfp8-floor")


def test_vllm_refuses_native_only_options_that_change_results(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = build_config(get_preset("tiny-dense"))
    with pytest.raises(EngineUnavailableError, match="grid-fraction"):
        make_sampler_engine("vllm", config=cfg, grid_fraction=0.5)
    with pytest.raises(EngineUnavailableError, match="kv-cache"):
        make_sampler_engine("vllm", config=cfg, kv_cache="fp8")


def test_sync_and_checker_per_engine_pair() -> None:
    from pipeline.engines.factory import make_sync_and_checker
    from pipeline.engines.vllm.checks import check_sync_vllm
    from pipeline.sync.invariants import check_sync
    from pipeline.sync.weight_sync import WeightSync

    syncer, checker = make_sync_and_checker("native", "native")
    assert type(syncer) is WeightSync and checker is check_sync
    syncer, checker = make_sync_and_checker("vllm", "native")
    assert type(syncer).__name__ == "VllmWeightSync" and checker is check_sync_vllm
    _, checker = make_sync_and_checker("vllm", "megatron")
    assert callable(checker) and checker not in (check_sync, check_sync_vllm)
