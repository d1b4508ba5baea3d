"""Which hardware an input's timings come from, and the warning when a step mixes hardware (issue 33)."""

from __future__ import annotations

import pytest

from perfmodel.inputs.hardware import hardware_of, hardware_warning

CPU_BOX = {"cpu": "AMD EPYC", "cpu_count": 2, "gpu": None}
GPU_BOX = {"cpu": "Intel Xeon", "cpu_count": 64, "gpu": "NVIDIA H100 80GB HBM3"}


@pytest.mark.parametrize(
    ("manifest", "kind", "want"),
    [
        ({"machine": CPU_BOX}, "sweep", "CPU"),
        ({"machine": GPU_BOX, "learner_device": "cuda:0"}, "sweep", "NVIDIA H100 80GB HBM3"),
        ({"machine": GPU_BOX, "config": {"learner_device": "cpu"}}, "run", "CPU"),
        # an ingest: the traced machine, not the one that ingested it
        (
            {"machine": CPU_BOX, "traces": [{"format": "kineto", "gpu_names": ["NVIDIA B200"]}]},
            "ingest",
            "NVIDIA B200",
        ),
        ({"machine": GPU_BOX, "traces": [{"format": "kineto", "devices": []}]}, "ingest", "CPU"),
        ({"machine": GPU_BOX, "traces": [{"format": "metric_log"}]}, "ingest", None),
        ({"machine": GPU_BOX, "traces": [{"format": "kineto", "devices": [0]}]}, "ingest", None),
    ],
)
def test_the_hardware_an_input_was_measured_on(manifest: dict, kind: str, want: str | None) -> None:
    assert hardware_of(manifest, kind) == want


def test_one_machine_gives_no_warning_and_others_are_named() -> None:
    assert hardware_warning({"sweep": "CPU"}, {"run-a": "CPU", "run-b": "CPU"}) is None
    assert hardware_warning({"sweep": None}, {"log": None}) is None  # nothing known: nothing to compare
    w = hardware_warning({"sweep": "CPU"}, {"trace": "NVIDIA B200", "log": None, "run": "CPU"})
    assert w is not None and "measured on CPU" in w
    assert "trace ran on NVIDIA B200" in w and "log do not record their hardware" in w and "run " not in w
