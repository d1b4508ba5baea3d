"""The whole step per precision (issue 33): every term the precision's own, micro-batches ceil(N / n), the
order of the inputs never changes the answer, a run folder of another model is refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mxperf.cli import main
from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.inputs.load import FitInputs, load_inputs
from perfmodel.inputs.simulate import simulate_sweep
from perfmodel.report.results import analyze
from perfmodel.step.model import build_steps, compare_at, parse_at, parse_phase_flags
from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.manifest import OutputDir

SIZES = (256, 512, 1024, 2048, 4096)


def _sweep(model: str = "sim", **kw) -> pd.DataFrame:
    return simulate_sweep(sizes=SIZES, repeats=4, model=model, **kw)


def _run(path: Path, model: str, learner: str, sampler: str, phases: dict[str, list[float]], **cfg) -> Path:
    """An mxperf run folder: metrics.parquet with one row per step, the manifest's config."""
    k = len(next(iter(phases.values())))
    metrics = pd.DataFrame(
        {
            "step": range(k),
            **{f"{p}_s": v for p, v in phases.items()},
            "num_microbatches": [cfg.get("k", 2)] * k,
            "update_tokens": [cfg.get("tokens", 2048)] * k,
        }
    )
    config = {
        "model": model,
        "learner": learner,
        "sampler": sampler,
        "tokens_per_microbatch": cfg.get("n", 1024),
    }
    with OutputDir(path, kind="run", command=["test"], config=config) as od:
        store.write_table(metrics, od.path / store.METRICS)
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("step")
    sweep = d / "sweep"
    with OutputDir(sweep, kind="sweep", command=["test"]) as od:
        store.write_table(_sweep(), od.path / store.MICROBATCHES)
    return {
        "sweep": sweep,
        # MXFP8's sampler is faster: generate 1.5 s against 2.0 s; sync the same
        "bf16": _run(d / "run-bf16", "sim", "bf16", "bf16", {"generate": [2.0, 2.1, 1.9], "sync": [0.3] * 3}),
        "mxfp8": _run(
            d / "run-mxfp8", "sim", "mxfp8", "mxfp8", {"generate": [1.5, 1.6, 1.4], "sync": [0.25] * 3}
        ),
        "other-model": _run(d / "run-other", "qwen3-8b", "bf16", "bf16", {"generate": [9.0] * 3}),
    }


def _doc(paths: list[Path], **kw) -> dict:
    inputs = load_inputs([str(p) for p in paths])
    return analyze(inputs, n_boot=200, **kw)


def test_each_precision_takes_its_own_folders_phase_times(folders) -> None:
    doc = _doc([folders["sweep"], folders["bf16"], folders["mxfp8"]])
    sm = doc["step_model"][0]
    assert sm["phases"]["bf16"]["generate"]["seconds"] == pytest.approx(2.0)
    assert sm["phases"]["mxfp8"]["generate"]["seconds"] == pytest.approx(1.5)
    assert sm["phases"]["mxfp8"]["update"]["kind"] == "fitted"
    s = sm["settings"][0]  # the runs' settings: 2048 tokens per step, 1024 per micro-batch
    assert (s["global_tokens"], s["tokens_per_microbatch"], s["microbatches"]) == (2048, 1024, 2)
    pb, pl = s["per_precision"]["bf16"]["phases_s"], s["per_precision"]["mxfp8"]["phases_s"]
    assert pl["generate"] - pb["generate"] == pytest.approx(-0.5)
    assert pl["sync"] - pb["sync"] == pytest.approx(-0.05)
    assert s["per_precision"]["bf16"]["step_s"] == pytest.approx(sum(pb.values()))
    # the per-phase shares add up to the whole gain
    assert sum(s["gain_by_phase"].values()) == pytest.approx(s["gain"])
    # the per-entry step section adds each precision's own phases, never one folder's to both
    own = doc["models"][0]["step"]["other_phases_by_precision_s"]
    assert own["bf16"]["generate"] == pytest.approx(2.0) and own["mxfp8"]["generate"] == pytest.approx(1.5)


def test_the_order_of_the_inputs_never_changes_the_answer(folders) -> None:
    a = _doc([folders["sweep"], folders["bf16"], folders["mxfp8"]])
    b = _doc([folders["mxfp8"], folders["sweep"], folders["bf16"]])
    assert json.dumps(a["step_model"], sort_keys=True) == json.dumps(b["step_model"], sort_keys=True)


def test_a_run_folder_of_another_model_is_refused_and_named(folders) -> None:
    with pytest.raises(InputError, match=r"run-other: a run of model 'qwen3-8b'.*fits are of sim"):
        _doc([folders["sweep"], folders["bf16"], folders["mxfp8"], folders["other-model"]])


def test_a_phase_known_for_one_precision_only_stops_the_answer(folders) -> None:
    sm = _doc([folders["sweep"], folders["bf16"]])["step_model"][0]
    assert sm["settings"] == [] and sm["recommendation"] is None
    assert "generate known for bf16 only" in sm["reason"] and "--phase mxfp8:generate=SECONDS" in sm["reason"]


def test_phase_flags_are_per_precision_and_win_over_run_folders(folders) -> None:
    sm = _doc(
        [folders["sweep"], folders["bf16"], folders["mxfp8"]],
        phase_times={("mxfp8", "generate"): 1.0},
        at=[(4096, 1024)],
    )["step_model"][0]
    assert sm["phases"]["mxfp8"]["generate"] == {
        "kind": "given",
        "source": "--phase mxfp8:generate",
        "seconds": 1.0,
        "steps": None,
        "at_global_tokens": None,
        "scaled": False,
    }
    assert sm["phases"]["bf16"]["generate"]["seconds"] == pytest.approx(2.0)
    s = sm["settings"][0]
    assert s["source"] == "--at" and s["measured_at_other_global_batch"] == ["generate", "sync"]


def test_a_mixed_run_gives_generate_to_its_sampler_and_update_to_its_learner(tmp_path) -> None:
    run = _run(
        tmp_path / "mixed",
        "sim",
        "mxfp8",
        "bf16",
        {"generate": [2.0] * 3, "logprob": [0.7] * 3, "sync": [0.1] * 3},
    )
    inputs = FitInputs(microbatches=_sweep(), runs=_read_run(run))
    fits = fit_cost_model(inputs.microbatches, n_boot=50)
    f = {(ph, p): v for (_, ph, p), v in fits.items()}
    steps, _ = build_steps("sim", f, ["bf16", "mxfp8"], inputs.runs, {}, {}, ["sim"])
    assert steps["bf16"].terms["generate"].seconds == 2.0 and "generate" not in steps["mxfp8"].terms
    assert steps["mxfp8"].terms["logprob"].seconds == 0.7 and "logprob" not in steps["bf16"].terms
    assert steps["bf16"].terms["sync"].seconds == 0.1


def _read_run(path: Path) -> list:
    from perfmodel.inputs.load import read_run_folder
    from tracing.outputs.manifest import read_manifest

    return [read_run_folder(path, read_manifest(path))]


def test_a_step_holds_ceil_n_over_n_micro_batches_the_last_one_the_rest() -> None:
    fits = fit_cost_model(_sweep(noise=0.0, repeat_noise=0.0), n_boot=50)
    f = {(ph, p): v for (_, ph, p), v in fits.items()}
    steps, _ = build_steps("sim", f, ["bf16", "mxfp8"], [], {}, {}, ["sim"])
    curve = fits[("sim", "update", "bf16")].wall.curve()
    # 10,000 tokens in micro-batches of 3,000: 3 full ones and one of 1,000 (not 10,000 / 3,000 = 3.33 of them)
    want = 3 * float(curve(3000)) + float(curve(1000))
    assert steps["bf16"].seconds(10_000, 3000) == pytest.approx(want)
    assert steps["bf16"].seconds(10_000, 3000) != pytest.approx(10_000 / 3000 * float(curve(3000)))
    # truth: bf16 10 ms + 4 us/token per micro-batch
    assert steps["bf16"].seconds(10_000, 3000) == pytest.approx(4 * 0.010 + 10_000 * 4e-6, rel=1e-3)
    cmp = compare_at(steps["bf16"], steps["mxfp8"], 10_000, 3000)
    assert cmp["microbatches"] == 4
    true_gain = 1 - (4 * 0.019 + 10_000 * 2e-6) / (4 * 0.010 + 10_000 * 4e-6)
    assert cmp["gain"] == pytest.approx(true_gain, rel=1e-2)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("mxfp8:generate", "expected PRECISION:PHASE=SECONDS"),
        ("mxfp8:generate=-1", "expected PRECISION:PHASE=SECONDS"),
        ("fp4:generate=1", "not a precision id"),
        ("mxfp8:=1", "expected PRECISION:PHASE=SECONDS"),
    ],
)
def test_bad_phase_flags_are_refused(value: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_phase_flags([value])


def test_phase_flags_split_into_times_and_fit_selection() -> None:
    times, names = parse_phase_flags(["update", "mxfp8:generate=1.5", "bf16:generate=2"])
    assert names == ["update"] and times == {("mxfp8", "generate"): 1.5, ("bf16", "generate"): 2.0}


@pytest.mark.parametrize(
    ("value", "message"), [("4096", "expected N,n"), ("512,1024", "exceed"), ("0,0", "N,n")]
)
def test_bad_at_values_are_refused(value: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_at([value])


def test_at_takes_several_pairs() -> None:
    assert parse_at(["8192,1024", "65536,8192;4096,512"]) == [(8192, 1024), (65536, 8192), (4096, 512)]


def test_cli_bad_phase_flag_is_one_line_exit_2(folders, tmp_path, capsys) -> None:
    rc = main(["fit", str(folders["sweep"]), "-o", str(tmp_path / "o"), "--phase", "mxfp8:generate=fast"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--phase 'mxfp8:generate=fast'" in err[0]
    assert not (tmp_path / "o").exists()


def test_the_gain_interval_holds_its_estimate_and_the_step_intervals_theirs(folders) -> None:
    s = _doc([folders["sweep"], folders["bf16"], folders["mxfp8"]])["step_model"][0]["settings"][0]
    assert math.isfinite(s["gain"]) and s["gain_ci"][0] < s["gain"] < s["gain_ci"][1]
    for p in ("bf16", "mxfp8"):
        lo, hi = s["per_precision"][p]["step_ci"]
        assert lo < s["per_precision"][p]["step_s"] < hi
    assert np.isfinite(s["diff_ci"]).all()


def test_cli_at_gives_the_step_per_precision_and_the_gain_at_each_pair(folders, tmp_path, capsys) -> None:
    out = tmp_path / "fit"
    argv = ["fit", str(folders["sweep"]), str(folders["bf16"]), str(folders["mxfp8"]), "-o", str(out)]
    rc = main([*argv, "--bootstrap", "200", "--json", "--at", "8192,1024", "--at", "65536,4096;4096,512"])
    stdout = capsys.readouterr().out.splitlines()
    assert rc == 0
    sm = json.loads(stdout[-1])["step_model"][0]
    pairs = [(s["global_tokens"], s["tokens_per_microbatch"]) for s in sm["settings"]]
    assert pairs == [(8192, 1024), (65536, 4096), (4096, 512)]
    assert all(s["source"] == "--at" and s["gain_ci"] is not None for s in sm["settings"])
    # the first pair is the answer's first line; each further pair one line of its own
    assert "at 8,192 tokens per step, 1,024 per micro-batch (--at)" in stdout[0]
    said = [line for line in stdout if line.startswith("sim at ")]
    assert len(said) == 2 and "65,536 tokens per step, 4,096 per micro-batch (--at)" in said[0]
    # at 65,536 / 4,096 mxfp8 saves 2 us/token (truth): faster, and the line says so with its interval
    s = sm["settings"][1]
    assert s["significant"] and s["gain"] > 0 and "mxfp8 step" in said[0] and "faster than bf16" in said[0]


def test_cli_bad_at_is_one_line_exit_2(folders, tmp_path, capsys) -> None:
    rc = main(["fit", str(folders["sweep"]), "-o", str(tmp_path / "o"), "--at", "1024"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--at '1024'" in err[0]
    assert not (tmp_path / "o").exists()


def test_no_global_batch_is_invented_and_the_output_says_why(tmp_path, capsys) -> None:
    sweep = tmp_path / "sweep"  # a sweep without global_tokens, no run folder, no --global-batch / --at
    with OutputDir(sweep, kind="sweep", command=["test"]) as od:
        store.write_table(_sweep(), od.path / store.MICROBATCHES)
    out = tmp_path / "fit"
    rc = main(["fit", str(sweep), "-o", str(out), "--bootstrap", "100", "--json"])
    doc = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert rc == 0 and doc["global_batch_tokens"] is None
    rec = doc["models"][0]["step"]["recommendation"]
    assert rec["precision"] is None and rec["tokens_per_microbatch"] is None
    assert (
        rec["reason"].startswith("no global batch known") and "--global-batch N or --at N,n" in rec["reason"]
    )
    assert doc["models"][0]["step"]["step_breakeven"] == []
    sm = doc["step_model"][0]
    assert sm["global_tokens"] is None and sm["breakeven"] is None and sm["settings"] == []
    assert sm["recommendation"]["reason"].startswith("no global batch known")
    assert not list(out.glob("step_time_*.png"))


def test_the_step_recommendation_stays_inside_the_measured_sizes_and_says_extrapolated(folders) -> None:
    sm = _doc([folders["sweep"], folders["bf16"], folders["mxfp8"]], global_tokens=65536)["step_model"][0]
    rec = sm["recommendation"]
    assert sm["global_tokens_source"] == "--global-batch"
    # mxfp8 saves per token: the largest measured size (4,096) wins; larger ones are predicted faster still
    assert rec["precision"] == "mxfp8" and rec["tokens_per_microbatch"] == max(SIZES)
    ext = rec["per_precision"]["mxfp8"]["extrapolated_best"]
    assert ext["extrapolated"] and ext["tokens_per_microbatch"] > max(SIZES)
    assert rec["comparison"]["significant"] and rec["comparison"]["gain"] > 0


def test_the_memory_cap_caps_the_micro_batch(folders) -> None:
    cap = 5e7 + 4096.0 * 1500  # the simulation's memory line: 50 MB + 4 KiB per token -> 1,500 tokens
    sm = _doc([folders["sweep"], folders["bf16"], folders["mxfp8"]], global_tokens=65536, mem_cap_bytes=cap)
    sm = sm["step_model"][0]
    for p in ("bf16", "mxfp8"):
        r = sm["recommendation"]["per_precision"][p]
        assert r["memory_limit_tokens"] == pytest.approx(1500, rel=0.02)
        assert r["tokens_per_microbatch"] == 1024  # the largest measured size under the cap
        assert "extrapolated_best" not in r or r["extrapolated_best"]["tokens_per_microbatch"] <= 1500
    assert sm["breakeven"]["range"][1] == pytest.approx(1500, rel=0.02)


def test_stdout_fits_json_and_report_open_with_the_three_line_answer(folders, tmp_path, capsys) -> None:
    out = tmp_path / "fit"
    argv = ["fit", str(folders["sweep"]), str(folders["bf16"]), str(folders["mxfp8"]), "-o", str(out)]
    rc = main([*argv, "--bootstrap", "200", "--json", "--at", "65536,4096"])
    stdout = capsys.readouterr().out.splitlines()
    doc = json.loads(stdout[-1])
    assert rc == 0 and stdout[:3] == doc["answer"] == doc["step_model"][0]["answer"]
    gain, breakeven, change = stdout[:3]
    s = doc["step_model"][0]["settings"][0]
    lo, hi = (100 * x for x in s["gain_ci"])
    assert gain.startswith("sim: mxfp8 vs bf16 per step")
    assert "at 65,536 tokens per step, 4,096 per micro-batch (--at)" in gain
    assert (
        f"mxfp8 step {100 * s['gain']:.1f} % faster than bf16 (95 % CI {lo:+.1f} to {hi:+.1f} % gain)" in gain
    )
    assert "step = generate + update + sync" in gain
    assert breakeven.startswith("Breakeven at 65,536 tokens per step: ")
    assert change.startswith("What to change: use mxfp8 at 4,096 tokens per micro-batch")
    report = (out / store.REPORT).read_text().splitlines()
    assert report[2] == "## Answer" and report[4] == f"**{gain}**"
    details = report.index("## Statistical details")
    assert all("CR3" not in line and "Fieller" not in line for line in report[:details])
    assert any("CR3" in line for line in report[details:])


def test_the_papers_shape_a_faster_sampler_outweighs_a_slower_update(folders) -> None:
    # update: mxfp8 slower below n* = 4,500 tokens (PAPER_LIKE); generation 24 % faster (--phase)
    doc = _doc(
        [folders["sweep"]],
        at=[(8192, 1024)],
        phase_times={("bf16", "generate"): 3.0, ("mxfp8", "generate"): 2.28},
    )
    sm = doc["step_model"][0]
    s = sm["settings"][0]
    by = s["gain_by_phase"]
    assert by["update"] < 0 < by["generate"]  # where the gain comes from
    assert s["significant"] and s["gain"] > 0 and s["gain"] == pytest.approx(by["update"] + by["generate"])
    assert "gain by phase: generate +" in sm["answer"][0] and "update -" in sm["answer"][0]
