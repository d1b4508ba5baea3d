"""Issue 33 item 7: machine load recorded around sweeps and runs, the fit's verdict warns when it exceeded the
cores, the demo's sizes divide its global batch."""

from __future__ import annotations

import os

import pytest

from mxperf.commands.demo import DEMO_SIZES, demo_global_batch
from mxperf.commands.sweep import _ints
from perfmodel.inputs.load import load_inputs
from perfmodel.inputs.simulate import simulate_sweep
from perfmodel.report.results import analyze
from pipeline.experiments.load import exceeded, load_sample, record
from pipeline.learner.grpo import pack_microbatches
from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.manifest import OutputDir, read_manifest


def test_a_sample_is_this_machines_load_and_cores():
    s = load_sample()
    assert s["cpu_count"] == os.cpu_count()
    one, five, fifteen = s["loadavg"]
    assert min(one, five, fifteen) >= 0


def test_record_writes_start_and_end(tmp_path):
    with OutputDir(tmp_path / "o", kind="sweep", command=["t"]) as od:
        start = record(od, "start")
        end = record(od, "end", start)
    load = read_manifest(tmp_path / "o")["load"]
    assert load["start"] == start and load["end"] == end
    assert load["exceeded_cores"] == exceeded(start, end)


@pytest.mark.parametrize(
    ("start", "end", "want"),
    [(0.5, 1.9, False), (2.5, 1.0, True), (1.0, 2.01, True), (None, None, None)],
)
def test_exceeded_compares_the_one_minute_load_with_the_cores(start, end, want):
    def s(x):
        return None if x is None else {"loadavg": [x, 0.0, 0.0], "cpu_count": 2}

    assert exceeded(s(start), s(end)) is want


def _sweep(path, one_minute: float, cores: int):
    with OutputDir(path, kind="sweep", command=["t"]) as od:
        store.write_table(
            simulate_sweep(sizes=(256, 512, 1024, 2048), repeats=3, model="sim"), od.path / store.MICROBATCHES
        )
        sample = {"at": "x", "loadavg": [one_minute, 1.0, 1.0], "cpu_count": cores, "usable_cpus": cores}
        od.update(load={"start": sample, "end": sample, "exceeded_cores": one_minute > cores})
    return path


@pytest.mark.parametrize(("one_minute", "warned"), [(7.5, True), (1.5, False)])
def test_the_fits_verdict_warns_when_load_exceeded_the_cores(tmp_path, one_minute, warned):
    inputs = load_inputs([_sweep(tmp_path / "s", one_minute, cores=4)])
    doc = analyze(inputs, baseline="bf16", n_boot=50)
    said = [e["verdict"] for e in doc["models"]]
    assert all(("busier than its 4 cores" in v) is warned for v in said)
    assert (f"{one_minute:.1f} at the start" in said[0]) is warned
    assert bool(doc["load_warnings"]) is warned


def test_the_demo_sizes_divide_its_global_batch():
    sizes = _ints(DEMO_SIZES)
    g = demo_global_batch(sizes, 64)
    for n in sizes:
        plan = pack_microbatches([64] * (g // 64), n)  # the sweep's split of the global batch
        assert all(len(mb) * 64 == n for mb in plan), n  # every micro-batch full: no remainder batch
    assert len(set(sizes)) == len(sizes)


@pytest.mark.parametrize(
    ("sizes", "seq_len", "message"),
    [((64, 96), 64, "not a multiple"), ((64, 448, 512), 64, "smallest global batch")],
)
def test_demo_sizes_without_a_common_global_batch_are_refused(sizes, seq_len, message):
    with pytest.raises(InputError, match=message):
        demo_global_batch(sizes, seq_len)
