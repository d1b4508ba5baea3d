"""``mxperf ingest`` then ``mxperf fit`` of verl one-step-off-policy metric logs as verl writes them: separate,
generate is ``generate_async``, step = max(generate, learner) + sync.

Fixtures: tests/data/metric_logs/verl_one_step_off_*.jsonl. The per-phase ``step`` section of ``models[]``
leaves the other phases out with a note under that placement and adds them when colocated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxperf.cli import main
from perfmodel.inputs.simulate import simulate_sweep
from tracing.outputs import store
from tracing.outputs.manifest import OutputDir

LOGS = Path(__file__).parents[1] / "data" / "metric_logs"
GENERATE = {"bf16": 13.25, "mxfp8": 10.25}  # median timing_s/generate_async over steps 1..4
WAIT = {"bf16": 3.55, "mxfp8": 2.25}  # median timing_s/gen: what a sum would have added on top
AT = ("65536,4096", "8388608,4096")  # the sampler binds at the first; the update (fitted) grows past it


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("one_step_off")
    sweep = d / "sweep"
    with OutputDir(sweep, kind="sweep", command=["test"]) as od:
        store.write_table(
            simulate_sweep(sizes=(256, 512, 1024, 2048, 4096), repeats=3), od.path / store.MICROBATCHES
        )
    out = [str(sweep)]
    for prec in GENERATE:
        ingest = d / f"ingest-{prec}"
        log = LOGS / f"verl_one_step_off_{prec}.jsonl"
        assert main(["ingest", str(log), "-o", str(ingest), "--label", f"model=sim,precision={prec}"]) == 0
        out.append(str(ingest))
    return out


def _fit(tmp_path: Path, inputs: list[str], *extra: str) -> dict:
    at = [a for x in AT for a in ("--at", x)]
    argv = ["fit", *inputs, "-o", str(tmp_path / "fit"), "--bootstrap", "200", "--json", *at, *extra]
    assert main(argv) == 0
    return json.loads((tmp_path / "fit" / store.FITS).read_text())


def test_ingest_reads_the_generation_and_the_wait_apart(inputs) -> None:
    manifest = json.loads((Path(inputs[1]) / "manifest.json").read_text())
    (entry,) = manifest["traces"]
    assert entry["phase_keys"]["generate"] == ["timing_s/generate_async"]
    assert entry["phase_keys"]["generate_wait"] == ["timing_s/gen"]
    steps = store.read_table(Path(inputs[1]) / store.STEPS)
    wide = steps.pivot(index="step", columns="phase", values="seconds")
    assert wide["generate"].tolist() == [12.5, 13.0, 13.5, 14.0]


def test_fit_finds_separate_and_the_step_is_max_generate_learner_plus_sync(inputs, tmp_path) -> None:
    doc = _fit(tmp_path, inputs)
    (sm,) = doc["step_model"]
    assert (
        sm["placement"]["name"] == "separate" and "verl_one_step_off_bf16.jsonl" in sm["placement"]["source"]
    )
    assert sm["reason"] is None and len(sm["settings"]) == 2
    binds = []
    for s in sm["settings"]:
        for p, pp in s["per_precision"].items():
            ph = pp["phases_s"]
            assert ph["generate"] == pytest.approx(GENERATE[p]) and "generate_wait" not in ph
            learner = ph["logprob"] + ph["update"] + ph.get("other", 0.0)
            assert pp["step_s"] == pytest.approx(max(ph["generate"], learner) + ph["sync"])
            assert pp["step_s"] < ph["generate"] + WAIT[p] + learner + ph["sync"]  # the wait is not added
            binds.append(s["overlap"]["per_precision"][p]["binds"])
    assert binds[:2] == ["sampler", "sampler"] and binds[2:] == ["learner", "learner"]


def test_the_step_section_leaves_other_phases_out_under_separate(inputs, tmp_path) -> None:
    doc = _fit(tmp_path, inputs)
    step = doc["models"][0]["step"]
    assert step["placement"]["name"] == "separate"
    assert step["note"].startswith("separate sampler (the inputs: ")
    assert "the other phases are left out here: this section is update alone" in step["note"]
    assert step["other_phases_s"] == {} and step["other_phases_by_precision_s"] == {"bf16": {}, "mxfp8": {}}
    report = (tmp_path / "fit" / store.REPORT).read_text()
    assert "- Step level: separate sampler (the inputs: " in report


def test_the_step_section_adds_other_phases_when_colocated(inputs, tmp_path) -> None:
    doc = _fit(tmp_path, inputs, "--placement", "colocated")
    step = doc["models"][0]["step"]
    assert step["placement"] == {"name": "colocated", "source": "--placement"} and step["note"] is None
    own = step["other_phases_by_precision_s"]
    for p in GENERATE:
        assert own[p]["generate"] == pytest.approx(GENERATE[p]) and "generate_wait" not in own[p]
        assert set(own[p]) == {"generate", "logprob", "sync", "other"}
    sm = doc["step_model"][0]
    for pp in sm["settings"][0]["per_precision"].values():
        assert pp["step_s"] == pytest.approx(sum(pp["phases_s"].values()))
