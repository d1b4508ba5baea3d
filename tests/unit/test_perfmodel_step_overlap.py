"""Colocated vs separate sampler (issue 33 item 1): a separate sampler's generation overlaps the learner, so
step = max(generate, learner phases) + sync, per point and per replicate. Known truth: simulated run folders
whose steps follow that rule, with the learner's update from a PAPER_LIKE sweep."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from mxperf.cli import main
from perfmodel.fitting.fit_all import fit_cost_model
from perfmodel.inputs.load import RunFolder
from perfmodel.inputs.placement import separate_sampler_logs
from perfmodel.inputs.simulate import PAPER_LIKE, simulate_sweep
from perfmodel.step import overlap
from perfmodel.step.model import step_models
from perfmodel.step.whatifs import answer_what_ifs
from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.manifest import OutputDir

SIZES = (256, 512, 1024, 2048, 4096)
BIG_N, N = 65536, 4096
K = BIG_N // N
SYNC = 0.3


def _update(prec: str) -> float:
    """The learner's true update seconds at (BIG_N, N): K micro-batches of the PAPER_LIKE line."""
    fixed, per_token, _ = PAPER_LIKE[prec]
    return K * (fixed + per_token * N)


@pytest.fixture(scope="module")
def fits() -> dict:
    return fit_cost_model(simulate_sweep(sizes=SIZES, repeats=4, rng=np.random.default_rng(7)), n_boot=400)


def _run(prec: str, gen: float, logprob: float, seed: int, steps: int = 40) -> RunFolder:
    """A run folder of ``prec`` whose steps follow the separate-sampler rule around the given truths."""
    rng = np.random.default_rng([seed, len(prec)])
    g = gen * np.exp(0.03 * rng.standard_normal(steps))
    u = _update(prec) * np.exp(0.01 * rng.standard_normal(steps))
    lp = logprob * np.exp(0.02 * rng.standard_normal(steps)) if logprob else np.zeros(steps)
    s = np.full(steps, SYNC)
    phases = {"generate": g, "update": u, "sync": s, **({"logprob": lp} if logprob else {})}
    frame = pd.DataFrame(
        {
            "step": np.arange(steps, dtype=float),
            "microbatch_tokens": [None] * steps,
            "step_s": np.maximum(g, u + lp) + s,
            "num_microbatches": float(K),
            "update_tokens": float(BIG_N),
            **{f"{p}_s": v for p, v in phases.items()},
        }
    )
    return RunFolder(
        path=f"run-{prec}-{seed}",
        model="sim",
        learner=prec,
        sampler=prec,
        phases={p: [float(x) for x in v] for p, v in phases.items()},
        global_tokens=float(BIG_N),
        tokens_per_microbatch=float(N),
        steps=frame,
    )


def _truth(gen: dict[str, float], logprob: float) -> float:
    step = {p: max(gen[p], _update(p) + logprob) + SYNC for p in gen}
    return 1.0 - step["mxfp8"] / step["bf16"]


def _answer(fits, gen: dict[str, float], logprob: float = 0.0, seed: int = 0, **kw) -> dict:
    runs = [_run(p, gen[p], logprob, seed) for p in ("bf16", "mxfp8")]
    (sm,) = step_models(fits, "bf16", runs, seed=seed, n_boot=400, **kw)
    return sm


GEN_BINDS = {"bf16": 4.0, "mxfp8": 3.0}  # generation far longer than the learner's ~0.43 s
LEARNER_BINDS = {"bf16": 1.0, "mxfp8": 0.6}  # a faster mxfp8 sampler, but the learner (2.4 s) binds


def test_generation_binds_the_step_gain_is_the_generation_share(fits) -> None:
    sm = _answer(fits, GEN_BINDS, placement="separate")
    assert sm["placement"] == {"name": "separate", "source": "--placement"}
    (s,) = sm["settings"]  # the runs' own settings
    assert (s["global_tokens"], s["tokens_per_microbatch"]) == (BIG_N, N)
    pb = s["per_precision"]["bf16"]["phases_s"]
    assert s["per_precision"]["bf16"]["step_s"] == pytest.approx(pb["generate"] + pb["sync"])
    truth = _truth(GEN_BINDS, 0.0)
    assert s["gain"] == pytest.approx(truth, abs=0.01)
    assert s["gain_ci"][0] <= truth <= s["gain_ci"][1] and s["significant"]
    # only generation moves the step: its share is the whole gain, the learner's (mxfp8 update) is hidden
    g = s["gain_by_phase"]
    assert g["generate"] == pytest.approx(s["gain"], abs=1e-3) and g["update"] == 0.0
    assert sum(g.values()) == pytest.approx(s["gain"], abs=1e-12)
    ov = s["overlap"]
    assert ov["weights"] == {"sampler": 1.0, "learner": 0.0, "serial": 1.0}
    assert {p: ov["per_precision"][p]["binds"] for p in ("bf16", "mxfp8")} == {
        "bf16": "sampler",
        "mxfp8": "sampler",
    }
    assert ov["per_precision"]["mxfp8"]["sampler_longer_share"] == 1.0
    # the validation's whole step follows the same rule: within a few % of the runs' measured steps
    rows = [r for r in sm["validation"]["rows"] if r["kind"] == "step"]
    assert len(rows) == 2 and all(abs(r["error_pct"]) < 3 for r in rows) and not sm["validation"]["misses"]


def test_the_learner_binds_a_faster_sampler_gives_nothing(fits) -> None:
    sm = _answer(fits, LEARNER_BINDS, logprob=2.0, placement="separate")
    (s,) = sm["settings"]
    truth = _truth(LEARNER_BINDS, 2.0)
    assert abs(truth) < 0.01 and s["gain"] == pytest.approx(truth, abs=0.005)
    assert s["gain_ci"][0] <= truth <= s["gain_ci"][1]
    assert s["gain_by_phase"]["generate"] == 0.0  # 40 % faster generation, no gain: the learner is longer
    assert sum(s["gain_by_phase"].values()) == pytest.approx(s["gain"], abs=1e-12)
    colocated = _answer(fits, LEARNER_BINDS, logprob=2.0)["settings"][0]
    assert colocated["gain"] > 0.08  # adding the phases would credit the sampler with ~10 %


def test_the_interval_covers_the_truth_across_seeds(fits) -> None:
    truth = _truth(GEN_BINDS, 0.0)
    inside = [
        lo <= truth <= hi
        for seed in range(20)
        for lo, hi in [_answer(fits, GEN_BINDS, seed=seed, placement="separate")["settings"][0]["gain_ci"]]
    ]
    assert sum(inside) >= 17, sum(inside)


def test_what_ifs_on_a_hidden_learner_move_nothing(fits) -> None:
    sm = _answer(fits, GEN_BINDS, placement="separate")
    wi = answer_what_ifs(sm, *sm.pop("_steps"))
    gain = sm["settings"][0]["gain"]
    ends = [
        e
        for w in wi["what_ifs"]
        for e in ([w] if w["kind"] == "estimate" else list((w.get("range") or {}).values())[:2])
    ]
    assert ends and all(e["gain"] == pytest.approx(gain, abs=1e-12) for e in ends)
    assert not any(w["changes_answer"] for w in wi["what_ifs"])
    colocated = _answer(fits, GEN_BINDS)
    cw = answer_what_ifs(colocated, *colocated.pop("_steps"))
    host = next(w for w in cw["what_ifs"] if w["name"] == "host_overhead_removed")
    assert host["gain"] > colocated["settings"][0]["gain"] + 0.01  # adding the phases, the saving shows


def test_the_max_is_taken_per_replicate_not_of_the_medians(fits) -> None:
    gen = {"bf16": 2.85, "mxfp8": 2.85}  # generation about as long as the learner (update + 2.4 s logprob)
    sm = _answer(fits, gen, logprob=2.4, placement="separate")
    s = sm["settings"][0]
    lo, hi = s["per_precision"]["bf16"]["step_ci"]
    pb = s["per_precision"]["bf16"]["phases_s"]
    point_max = max(pb["generate"], pb["update"] + pb["logprob"]) + pb["sync"]
    assert s["per_precision"]["bf16"]["step_s"] == pytest.approx(point_max)
    # the band holds the point estimate and is the max's, not the sum's (that would be ~2.85 s higher)
    assert lo <= point_max <= hi and hi < point_max + 0.5
    share = s["overlap"]["per_precision"]["bf16"]["sampler_longer_share"]
    assert 0.0 < share < 1.0  # the sides swap between replicates: the max is taken in each


def test_colocated_is_the_default_and_adds_the_phases_exactly(fits) -> None:
    sm = _answer(fits, GEN_BINDS)
    assert sm["placement"]["name"] == "colocated" and sm["placement"]["source"].startswith("default")
    s = sm["settings"][0]
    for p in ("bf16", "mxfp8"):
        assert s["per_precision"][p]["step_s"] == sum(s["per_precision"][p]["phases_s"].values())
    assert s["overlap"] is None
    flagged = _answer(fits, GEN_BINDS, placement="colocated")
    flagged["placement"] = sm["placement"]
    assert json.dumps(flagged, sort_keys=True, default=str) == json.dumps(sm, sort_keys=True, default=str)


def test_the_order_of_the_inputs_never_changes_the_answer(fits) -> None:
    runs = [_run(p, GEN_BINDS[p], 2.0, 3) for p in ("bf16", "mxfp8")]
    a = step_models(fits, "bf16", runs, placement="separate", n_boot=300)
    b = step_models(dict(reversed(list(fits.items()))), "bf16", runs[::-1], placement="separate", n_boot=300)
    for sm in (a, b):
        sm[0].pop("_steps")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.parametrize(
    ("phases", "placement", "expected"),
    [
        ({"generate": 3.0, "update": 1.0, "sync": 0.5}, "colocated", 4.5),
        ({"generate": 3.0, "update": 1.0, "sync": 0.5}, "separate", 3.5),
        ({"generate": 1.0, "logprob": 1.5, "update": 1.0, "sync": 0.5, "eval": 1.0}, "separate", 4.0),
        ({"update": 1.0, "sync": 0.5}, "separate", 1.5),
    ],
)
def test_combine(phases: dict, placement: str, expected: float) -> None:
    assert overlap.combine(phases, placement) == pytest.approx(expected)


def test_combine_takes_the_max_per_replicate() -> None:
    reps = {"generate": np.array([1.0, 3.0]), "update": np.array([2.0, 2.0]), "sync": np.array([0.5, 0.5])}
    assert overlap.combine(reps, "separate").tolist() == [2.5, 3.5]


def test_side_weights_are_the_shapley_share_of_the_max() -> None:
    # the learner crosses the sampler: mxfp8's learner drops below the (unchanged) generation
    base, low = {"generate": 2.0, "update": 3.0}, {"generate": 2.0, "update": 1.0}
    w = overlap.side_weights(base, low, "separate")
    assert w["learner"] == pytest.approx(0.5)  # half of 3 -> 1 lies above 2
    g = overlap.gain_by_phase(base, low, 3.0, "separate")
    assert sum(g.values()) == pytest.approx(1 - 2.0 / 3.0) and g["generate"] == 0.0


@pytest.mark.parametrize(
    ("phases", "placement", "words"),
    [
        (["generate", "update", "sync"], "colocated", "generate + update + sync"),
        (
            ["generate", "reference", "logprob", "update", "sync"],
            "separate",
            "max(generate, reference + logprob + update) + sync",
        ),
        (["update", "sync"], "separate", "update + sync"),
    ],
)
def test_formula(phases: list, placement: str, words: str) -> None:
    assert overlap.formula(phases, placement) == words


def test_a_bad_placement_is_one_line_naming_the_flag() -> None:
    with pytest.raises(InputError, match=r"^--placement 'sep': choose colocated or separate$"):
        overlap.parse_placement("sep")


def test_async_trainer_logs_say_separate_and_others_do_not() -> None:
    manifest = {
        "config": {"labels": {"model": "sim"}},
        "traces": [
            {
                "path": "a.jsonl",
                "framework": "verl",
                "labels": {"precision": "bf16"},
                "phase_keys": {"generate": ["timing_s/gen", "timing_s/generate_async"]},
            },
            {
                "path": "b.json",
                "framework": "nemo_rl",
                "labels": {"precision": "mxfp8"},
                "phase_keys": {"generate": ["timing/train/exposed_generation"]},
            },
            {
                "path": "c.jsonl",
                "framework": "verl",
                "labels": {"precision": "fp8"},
                "phase_keys": {"generate": ["timing_s/gen"], "sync": ["timing_s/timing_s/param_sync"]},
            },
        ],
    }
    said = separate_sampler_logs(manifest)
    assert set(said) == {"bf16", "mxfp8"}
    assert (
        said["bf16"].startswith("a.jsonl: verl one-step-off-policy") and "NeMo RL async GRPO" in said["mxfp8"]
    )


def _sweep_dir(tmp_path) -> str:
    d = tmp_path / "sweep"
    with OutputDir(d, kind="sweep", command=["test"]) as od:
        store.write_table(simulate_sweep(sizes=SIZES, repeats=3), od.path / store.MICROBATCHES)
    return str(d)


def test_cli_bad_placement_is_one_line_exit_2(tmp_path, capsys) -> None:
    rc = main(["fit", _sweep_dir(tmp_path), "-o", str(tmp_path / "o"), "--placement", "hybrid"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].endswith("--placement 'hybrid': choose colocated or separate")
    assert not (tmp_path / "o").exists()


def test_cli_separate_is_said_in_the_answer_report_and_fits_json(tmp_path, capsys) -> None:
    out = tmp_path / "fit"
    argv = [
        "fit",
        _sweep_dir(tmp_path),
        "-o",
        str(out),
        "--bootstrap",
        "200",
        "--json",
        "--placement",
        "separate",
    ]
    times = ["--phase", "bf16:generate=4.0", "--phase", "mxfp8:generate=3.0", "--other-phase", "sync=0.3"]
    rc = main([*argv, *times, "--at", f"{BIG_N},{N}"])
    stdout = capsys.readouterr().out.splitlines()
    assert rc == 0
    sm = json.loads(stdout[-1])["step_model"][0]
    assert sm["placement"] == {"name": "separate", "source": "--placement"}
    s = sm["settings"][0]
    assert s["gain"] == pytest.approx(1 - 3.3 / 4.3)
    assert "step = max(generate, update) + sync: separate sampler (--placement)" in stdout[0]
    assert "generation is the longer side in both precisions" in stdout[0]
    report = (out / store.REPORT).read_text()
    assert "Placement: separate sampler, step = max(generate, update) + sync (--placement)." in report
    # breakeven: mxfp8's learner (K micro-batches of 19 ms + 2 us/token) outgrows its 3 s generation below
    # n = 65,536 * 0.019 / (4 - 65,536 * 2e-6) = 322 tokens, where the bf16 step is still 4 s + sync
    be = sm["breakeven"]
    truth = BIG_N * PAPER_LIKE["mxfp8"][0] / (GEN_BINDS["bf16"] - BIG_N * PAPER_LIKE["mxfp8"][1])
    assert be["case"] == "faster_above" and be["tokens"] == pytest.approx(truth, rel=0.1)
    assert be["ci"][0] <= truth <= be["ci"][1]


def test_the_same_binding_generation_in_both_leaves_no_breakeven_to_scan(tmp_path, capsys) -> None:
    argv = ["fit", _sweep_dir(tmp_path), "-o", str(tmp_path / "fit"), "--bootstrap", "100", "--json"]
    rc = main([*argv, "--placement", "separate", "--other-phase", "generate=9", "--at", f"{BIG_N},{N}"])
    sm = json.loads(capsys.readouterr().out.splitlines()[-1])["step_model"][0]
    assert rc == 0 and sm["settings"][0]["gain"] == 0.0
    assert sm["breakeven"]["case"] is None and "equally long at every size" in sm["breakeven"]["reason"]
