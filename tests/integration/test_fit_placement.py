"""The placement from the inputs: ``mxperf ingest`` of a verl one-step-off-policy metric log, then ``mxperf
fit``: separate, named with the log (its ``timing_s/generate_async`` timer); ``--placement`` overrides.

The log's generate phase is that generation time; its ``gen``, the trainer's wait, is no term.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxperf.cli import main
from perfmodel.inputs.simulate import simulate_sweep
from tracing.outputs import store
from tracing.outputs.manifest import OutputDir

GEN = {"bf16": 4.0, "mxfp8": 3.0}  # generation (generate_async); the learner: 1 s logprob + the update
LEARNER_S = 1.0 + 2.5
AT = "65536,4096"


def _log(path: Path, prec: str) -> Path:
    """verl one-step-off-policy FileLogger lines: gen is the wait for the generation launched a step ago."""
    lines = []
    for step in range(1, 13):
        g = GEN[prec] * (1 + 0.01 * ((step % 5) - 2))
        timers = {
            "timing_s/gen": max(0.0, g - LEARNER_S),
            "timing_s/generate_async": g,
            "timing_s/sync_rollout_weights": 0.3,
            "timing_s/old_log_prob": 1.0,
            "timing_s/update_actor": 2.5,
            "timing_s/step": max(g, LEARNER_S) + 0.3,
        }
        lines.append(json.dumps({"step": step, "data": timers}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("placement")
    sweep = d / "sweep"
    with OutputDir(sweep, kind="sweep", command=["test"]) as od:
        store.write_table(
            simulate_sweep(sizes=(256, 512, 1024, 2048, 4096), repeats=3), od.path / store.MICROBATCHES
        )
    out = [str(sweep)]
    for prec in GEN:
        log = _log(d / "logs" / f"{prec}.jsonl", prec)
        ingest = d / f"ingest-{prec}"
        assert main(["ingest", str(log), "-o", str(ingest), "--label", f"model=sim,precision={prec}"]) == 0
        out.append(str(ingest))
    return out


def _fit(tmp_path: Path, inputs: list[str], *extra: str) -> tuple[dict, list[str]]:
    argv = ["fit", *inputs, "-o", str(tmp_path / "fit"), "--bootstrap", "200", "--json", "--at", AT, *extra]
    assert main(argv) == 0
    return json.loads((tmp_path / "fit" / store.FITS).read_text()), (
        tmp_path / "fit" / store.REPORT
    ).read_text().splitlines()


def test_an_async_trainers_log_says_separate_and_its_generation_time_is_the_generate_term(
    inputs, tmp_path
) -> None:
    doc, _ = _fit(tmp_path, inputs)
    sm = doc["step_model"][0]
    assert sm["placement"]["name"] == "separate"
    assert sm["placement"]["source"].startswith("the inputs: ")
    assert (
        "bf16.jsonl: verl one-step-off-policy trainer (timer timing_s/generate_async)"
        in sm["placement"]["source"]
    )
    assert sm["reason"] is None
    pp = sm["settings"][0]["per_precision"]
    for p in GEN:  # generate_async, not gen + generate_async; the wait is no term
        ph = pp[p]["phases_s"]
        assert ph["generate"] == pytest.approx(GEN[p], rel=0.011) and "generate_wait" not in ph
        assert pp[p]["step_s"] == pytest.approx(
            max(ph["generate"], ph["logprob"] + ph["update"]) + ph["sync"]
        )
    assert "step = max(generate, logprob + update) + sync: separate sampler (the inputs: " in doc["answer"][0]


def test_given_the_generation_time_the_max_rule_answers(inputs, tmp_path) -> None:
    times = ["--phase", "bf16:generate=4.0", "--phase", "mxfp8:generate=3.0"]
    doc, report = _fit(tmp_path, inputs, *times)
    sm = doc["step_model"][0]
    (s,) = sm["settings"]
    pp = s["per_precision"]
    for p in GEN:  # max(generate, logprob + update) + sync, the update from the sweep's fit
        ph = pp[p]["phases_s"]
        assert pp[p]["step_s"] == pytest.approx(
            max(ph["generate"], ph["logprob"] + ph["update"]) + ph["sync"]
        )
        assert pp[p]["step_s"] == pytest.approx(GEN[p] + 0.3, rel=0.01)
    assert s["gain_by_phase"]["logprob"] == 0.0 and s["gain_by_phase"]["update"] == 0.0
    assert "step = max(generate, logprob + update) + sync: separate sampler (the inputs: " in doc["answer"][0]
    assert any(
        line.startswith("Placement: separate sampler, step = max(generate, logprob + update) + sync")
        for line in report
    )


def test_placement_colocated_adds_the_logged_phases_and_says_what_it_overrode(inputs, tmp_path) -> None:
    doc, report = _fit(tmp_path, inputs, "--placement", "colocated")
    sm = doc["step_model"][0]
    assert sm["placement"] == {"name": "colocated", "source": "--placement"}
    s = sm["settings"][0]
    for p in GEN:
        assert s["per_precision"][p]["step_s"] == sum(s["per_precision"][p]["phases_s"].values())
        assert "generate_wait" not in s["per_precision"][p]["phases_s"]
    assert any(n.startswith("--placement colocated used, though ") for n in doc["notes"])
    assert "Placement: colocated sampler, step = generate + logprob + update + sync (--placement)." in report


def test_an_async_log_beside_a_colocated_one_is_said_not_silently_applied(inputs, tmp_path) -> None:
    """#33: one precision's log from the one-step-off trainer, the other's from the colocated trainer: the
    separate placement is the async log's only, and the answer says the other input does not back it."""
    d = tmp_path / "sync"
    lines = [
        json.dumps(
            {"step": s, "data": {"timing_s/gen": 3.0, "timing_s/update_actor": 2.5, "timing_s/step": 5.8}}
        )
        for s in range(1, 9)
    ]
    (d / "logs").mkdir(parents=True)
    (d / "logs" / "mxfp8.jsonl").write_text("\n".join(lines) + "\n")
    ingest = d / "ingest-mxfp8"
    argv = [
        "ingest",
        str(d / "logs" / "mxfp8.jsonl"),
        "-o",
        str(ingest),
        "--label",
        "model=sim,precision=mxfp8",
    ]
    assert main(argv) == 0
    doc, report = _fit(tmp_path, [inputs[0], inputs[1], str(ingest)])
    assert doc["step_model"][0]["placement"]["name"] == "separate"
    (note,) = [n for n in doc["notes"] if "do not say they ran with one" in n]
    assert str(ingest) in note and inputs[1] in note
    assert any("do not say they ran with one" in line for line in report)
    doc, _ = _fit(tmp_path / "same", inputs)  # both logs async: no such note
    assert not [n for n in doc["notes"] if "do not say they ran with one" in n]
