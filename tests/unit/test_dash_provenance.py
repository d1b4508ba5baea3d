"""dashboards.provenance: every card says what ran it; CPU low precision is emulation; a trace shows its GPU."""

from __future__ import annotations

from dashboards.provenance import NOT_RECORDED, Provenance, combine, provenance

CPU = {"cpu": "AMD EPYC", "gpu": None}


def _run(precisions: tuple[str, ...], machine: dict, **extra) -> Provenance:
    return provenance({"kind": "run", "machine": machine, **extra}, precisions)


def test_cpu_run_with_mxfp8_says_emulated_and_cpu() -> None:
    p = _run(("mxfp8", "mxfp8"), CPU)
    assert p.device == "CPU (AMD EPYC)" and p.low_precision == "emulated"
    assert "not what it costs on a GPU" in p.note and "mxfp8, mxfp8" not in p.note
    assert _run(("bf16",), CPU).low_precision == "n/a"


def test_gpu_run_names_the_gpu_and_its_device() -> None:
    h100 = {"cpu": "x", "gpu": "NVIDIA H100 80GB HBM3"}
    p = _run(("fp8-block128",), h100, learner_device="cuda:0", sampler_device="cuda:0")
    assert p.device == "NVIDIA H100 80GB HBM3 (cuda:0)"
    assert p.low_precision == NOT_RECORDED  # native or emulated is not guessed
    assert (
        _run(("mxfp8",), h100, learner_device="cuda:0").low_precision == "emulated"
    )  # no MX GEMMs on Hopper
    assert _run(("mxfp8",), {"gpu": "NVIDIA B200"}, learner_device="cuda:0").low_precision == NOT_RECORDED
    rec = _run(("fp8-tensor",), h100, learner_device="cuda:0", emulated=False)
    assert rec.low_precision == "native"


def test_the_gemm_backend_a_run_or_sweep_recorded_wins() -> None:
    h200 = {"gpu": "NVIDIA H200"}
    run = _run(
        ("fp8-block128", "fp8-block128"),
        h200,
        learner_device="cuda:0",
        engines={"learner": {"precision": "fp8-block128", "gemm_backend": "scaled_mm"}},
    )
    assert run.low_precision == "native" and "native GEMMs (scaled_mm)" in run.note
    sweep = provenance(
        {
            "kind": "sweep",
            "machine": h200,
            "learner_device": "cuda:0",
            "learners": {
                "bf16": {"gemm_backend": "emulated"},
                "mxfp8": {"gemm_backend": "emulated"},
                "fp8-rowwise": {"gemm_backend": "scaled_mm"},
            },
        },
        ("bf16", "mxfp8", "fp8-rowwise"),
    )
    assert sweep.low_precision == "emulated/native"
    assert (
        "mxfp8: emulated (exact bytes)" in sweep.note
        and "fp8-rowwise: native GEMMs (scaled_mm)" in sweep.note
    )
    cpu = _run(
        ("mxfp8",),
        CPU,
        learner_device="cpu",
        engines={"learner": {"precision": "mxfp8", "gemm_backend": "emulated"}},
    )
    assert cpu.device.startswith("CPU") and cpu.low_precision == "emulated"


def test_old_manifest_on_a_gpu_machine_does_not_claim_the_gpu() -> None:
    p = _run(("mxfp8",), {"gpu": "NVIDIA A100"})
    assert p.device.startswith(NOT_RECORDED) and "NVIDIA A100" in p.device


def test_sampler_on_another_device_is_said() -> None:
    p = _run(("bf16",), {"gpu": "NVIDIA H100"}, learner_device="cuda:0", sampler_device="cuda:1")
    assert "Sampler on cuda:1" in p.note


def test_ingest_shows_the_traced_gpu_not_the_ingesting_machine() -> None:
    manifest = {
        "kind": "ingest",
        "machine": CPU,
        "traces": [
            {"devices": [{"device": 0}], "gpu_names": ["NVIDIA A100-SXM4-80GB"]},
            {"devices": [{"device": 1}], "gpu_names": ["NVIDIA A100-SXM4-80GB"]},
        ],
    }
    p = provenance(manifest)
    assert p.device == "2 x NVIDIA A100-SXM4-80GB (from the trace)" and "CPU" not in p.device
    unnamed = provenance(
        {"kind": "ingest", "machine": CPU, "traces": [{"devices": [{}, {}], "gpu_names": []}]}
    )
    assert unnamed.device == "2 GPU(s), name not in the trace"
    cpu_only = provenance({"kind": "ingest", "traces": [{"devices": [], "gpu_names": []}]})
    assert cpu_only.device == "CPU-only trace"


def test_combine_joins_inputs() -> None:
    a = _run(("bf16", "mxfp8"), CPU)
    b = _run(("bf16",), CPU)
    both = combine([a, b])
    assert both.device == "CPU (AMD EPYC)" and both.low_precision == "emulated"
    assert combine([]).device == NOT_RECORDED


def test_a_metric_log_import_never_claims_a_device() -> None:
    manifest = {
        "kind": "ingest",
        "machine": CPU,
        "traces": [{"format": "metric_log", "framework": "verl", "devices": []}],
    }
    p = provenance(manifest)
    assert p.device == "verl metric log (device not recorded)" and "CPU" not in p.device
