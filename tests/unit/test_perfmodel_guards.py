"""The fit's guards against confident wrong answers (issue 32), one case each, with known truth.

Outliers are left out and named; two sizes leave linearity untested; one unit per precision is undetermined;
overlapping windows and a per-step cost below zero give no breakeven; a test without power says "no evidence
against the line"; the knee's per-token saving is said only when measured; no recommendation without a case
and interval that support it; emulation and provenance are said as the inputs have them. The same scenarios
at 100 seeds: tests/unit/test_perfmodel_simulations.py (slow) and benchmarks/fit_simulations.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfmodel.api import fit
from perfmodel.inputs.load import load_inputs
from perfmodel.inputs.simulate import PAPER_LIKE, simulate_sweep
from perfmodel.report.markdown import render_report
from perfmodel.report.results import analyze
from perfmodel.simstudy import SCENARIOS, run, summarize
from tracing.outputs import store
from tracing.outputs.manifest import OutputDir


def _entry(df: pd.DataFrame, n_boot: int = 200, seed: int = 0) -> dict:
    (e,) = fit(df, n_boot=n_boot, seed=seed)["models"]
    return e


def _doc(e: dict) -> dict:
    return {"models": [e], "bootstrap": {"resamples": 200}, "x_variable": "num_tokens", "inputs": []}


def test_two_outliers_are_left_out_named_and_do_not_change_the_answer() -> None:
    df = SCENARIOS["outliers_large"].make(np.random.default_rng(10_001))
    e = _entry(df)
    be = e["breakeven"]
    assert be["case"] == "faster_above" and be["ci"][0] <= 4500 <= be["ci"][1]
    out = e["fits"]["mxfp8"]["outliers"]
    assert len(out) == 2 and all(
        o["tokens_per_microbatch"] == 16384 and o["ratio_to_median"] > 2.5 for o in out
    )
    assert e["fits"]["bf16"]["outliers"] == []
    assert "Left out as outliers: mxfp8 2 micro-batches" in e["verdict"]
    report = render_report(_doc(e))
    assert "2 micro-batch(es) left out as outliers" in report and "16,384 tokens, repeat" in report


def test_a_clean_sweep_loses_no_micro_batch_and_a_per_step_cost_on_the_last_one_is_kept() -> None:
    assert all(not f["outliers"] for f in _entry(simulate_sweep(PAPER_LIKE))["fits"].values())
    from perfmodel.inputs.simulate import Truth

    truth = {"bf16": Truth(0.010, 4e-6, 0.002), "mxfp8": Truth(0.013, 2e-6, 0.005, per_step_s=0.03)}
    df = simulate_sweep(
        truth, global_tokens=[16384, 65536], per_step_on="last", rng=np.random.default_rng(24)
    )
    f = _entry(df, n_boot=50)["fits"]["mxfp8"]
    assert f["outliers"] == [] and "a cost paid once per step in the last micro-batch" in f["outlier_note"]


def test_two_sizes_leave_linearity_untested_and_the_interval_is_the_measured_bracket() -> None:
    e = _entry(SCENARIOS["two_sizes_knee"].make(np.random.default_rng(10_000)))
    be = e["breakeven"]
    assert be["model_ok"] is False and be["model"] == "line" and "linearity untested" in be["model_reason"]
    assert be["case"] == "faster_above" and be["ci_method"] == "measured" and be["ci"] == [2048.0, 8192.0]
    assert 2048 <= be["tokens"] <= 8192
    for f in e["fits"].values():
        assert f["linearity"] == "untested" and "fits the measured sizes" not in f["model_note"]
    assert "model-free bracket: linearity untested" in e["verdict"]
    assert e["host_stall_share_of_added_fixed"] is None  # a two-size intercept is an extrapolation


def test_two_sizes_without_a_sign_change_are_undetermined() -> None:
    truth = {"bf16": (0.010, 4e-6, 0.002), "mxfp8": (0.019, 2e-6, 0.009)}  # n* = 4,500, above both sizes
    e = _entry(simulate_sweep(truth, sizes=(512, 2048), rng=np.random.default_rng(3)))
    be = e["breakeven"]
    assert be["case"] == "undetermined" and be["tokens"] is None and be["tokens_estimate"] is not None
    assert "slower at every size" in e["verdict"]  # what the two sizes do say
    assert e["step"]["recommendation"]["precision"] is None


def test_one_unit_per_precision_is_undetermined_with_no_recommendation() -> None:
    e = _entry(SCENARIOS["one_unit"].make(np.random.default_rng(10_000)))
    be = e["breakeven"]
    assert be["case"] == "undetermined" and be["tokens"] is None and be["ci"] == [None, None]
    assert "one independent unit (step) per precision" in be["ci_reason"]
    assert e["step"]["recommendation"]["precision"] is None
    assert e["answer"].endswith(be["ci_reason"]) and "undetermined" in e["answer"]


@pytest.mark.parametrize("scenario", ["overlap", "overlap_unflagged"])
def test_overlapping_windows_give_no_breakeven_and_no_recommendation(scenario: str) -> None:
    e = _entry(SCENARIOS[scenario].make(np.random.default_rng(10_000)))
    be = e["breakeven"]
    assert be["model"] is None and be["tokens"] is None and be["case"] == "undetermined"
    want = "micro-batch windows overlap" if scenario == "overlap" else "per-step cost"
    assert want in be["model_reason"]
    assert "no breakeven, no recommendation" in e["verdict"]
    rec = e["step"]["recommendation"]
    assert rec["precision"] is None and rec["reason"]
    assert e["breakeven_gpu_busy"] is None or e["breakeven_gpu_busy"]["model"] is None


def test_a_lack_of_fit_test_without_power_is_no_evidence_not_a_fit() -> None:
    df = simulate_sweep(PAPER_LIKE, sizes=(512, 1024, 2048, 4096), repeats=3, noise=0.4, repeat_noise=0.2)
    e = _entry(df, n_boot=100)
    for f in e["fits"].values():
        if f["linearity"] != "rejected":
            assert f["linearity"] == "no evidence against"
            assert f["model_note"].startswith("no evidence against the line (noise +-")
            assert f["lack_of_fit"]["noise_rel"] > 0.03 and f["lack_of_fit"]["weak"] is True
    clean = _entry(simulate_sweep(PAPER_LIKE, repeats=6, noise=0.01, repeat_noise=0.005), n_boot=50)
    assert {f["linearity"] for f in clean["fits"].values()} == {"fits"}
    assert all("fits the measured sizes" in f["model_note"] for f in clean["fits"].values())


def test_the_knee_saving_once_gpu_bound_is_said_only_with_two_gpu_bound_sizes() -> None:
    short = _entry(SCENARIOS["knee_short"].make(np.random.default_rng(10_000)))
    assert "once GPU-bound not measured (mxfp8: 1 measured size GPU-bound)" in short["verdict"]
    assert short["fits"]["mxfp8"]["gpu_bound_sizes"] == 1
    full = _entry(SCENARIOS["knee"].make(np.random.default_rng(10_002)))
    assert "us/token once GPU-bound" in full["verdict"] and "not measured" not in full["verdict"]


def test_no_recommendation_inside_the_breakeven_interval_or_without_a_case() -> None:
    df = simulate_sweep(PAPER_LIKE, rng=np.random.default_rng(5))
    # a global batch of 4,500 tokens: the best size is at most 4,500 -- inside n*'s interval
    doc = analyze(load_inputs_from(df), n_boot=100, global_tokens=4500)
    rec = doc["models"][0]["step"]["recommendation"]
    assert rec["precision"] is None and "does not exclude that size" in rec["reason"]
    assert rec["case"] == "faster_above" and rec["breakeven_ci"][0] < 4500 < rec["breakeven_ci"][1]
    doc = analyze(load_inputs_from(df), n_boot=100, global_tokens=65536)
    rec = doc["models"][0]["step"]["recommendation"]
    assert rec["precision"] == "mxfp8" and rec["tokens_per_microbatch"] > rec["breakeven_ci"][1]
    report = render_report({**doc, "inputs": []})
    assert "case `faster_above`, breakeven 95 % CI" in report
    same = {"bf16": (0.010, 4e-6, 0.002), "mxfp8": (0.010, 4e-6, 0.002)}
    e = _entry(simulate_sweep(same, rng=np.random.default_rng(0)), n_boot=100)
    assert e["breakeven"]["case"] == "indistinguishable"
    assert e["step"]["recommendation"]["precision"] is None
    assert "use **" not in render_report(_doc(e))


def load_inputs_from(df: pd.DataFrame):
    from perfmodel.inputs.load import FitInputs

    return FitInputs(df)


def _sweep_dir(path, df: pd.DataFrame, **manifest) -> None:
    with OutputDir(path, kind="sweep", command=["t"]) as od:
        store.write_table(df, od.path / store.MICROBATCHES)
        od.update(**manifest)


def test_emulation_is_said_in_the_verdict_the_answer_the_report_and_the_plot_titles(tmp_path) -> None:
    from perfmodel.report import plots

    learners = {
        "bf16": {"learner_device": "cpu", "gemm_backend": "bf16"},
        "mxfp8": {"learner_device": "cpu", "gemm_backend": "emulated", "gemm_reason": "cpu has no MX GEMMs"},
    }
    _sweep_dir(tmp_path / "s", simulate_sweep(PAPER_LIKE), learner_device="cpu", learners=learners)
    inputs = load_inputs([tmp_path / "s"])
    assert "emulated on cpu" in inputs.emulated["mxfp8"] and "bf16" not in inputs.emulated
    doc = analyze(inputs, n_boot=50)
    (e,) = doc["models"]
    assert "[CPU emulation of mxfp8" in e["verdict"] and "[CPU emulation of mxfp8" in e["answer"]
    assert "**mxfp8 is emulated**" in render_report(doc)
    assert "learner on cpu" in doc["inputs"][0]["machine"]
    for make in (plots.time_vs_tokens_figure, plots.host_stall_figure):
        fig = make(e)
        assert "mxfp8 CPU-emulated" in fig.axes[0].get_title()
        plots.close(fig)


def _cpu_ingest(path, df: pd.DataFrame) -> None:
    with OutputDir(path, kind="ingest", command=["t"]) as od:
        store.write_table(df, od.path / store.MICROBATCHES)
        od.update(traces=[{"path": "t.json", "format": "kineto", "devices": [], "microbatches": len(df)}])


def test_two_ingested_cpu_runs_are_not_called_gpu_traces_nor_back_to_back(tmp_path) -> None:
    df = simulate_sweep(PAPER_LIKE, rng=np.random.default_rng(1)).assign(source="detected")
    na = pd.array([None] * len(df), dtype="Float64")
    df = df.assign(gpu_busy_seconds=na, host_stall_seconds=na)
    for prec in ("bf16", "mxfp8"):
        _cpu_ingest(tmp_path / prec, df[df["precision"] == prec])
    inputs = load_inputs([tmp_path / "bf16", tmp_path / "mxfp8"])
    assert all(s.machine.startswith("a CPU-only trace (no GPU ops)") for s in inputs.summaries)
    assert "CPU-only traces" in inputs.emulated["mxfp8"]
    doc = analyze(inputs, n_boot=50)
    (e,) = doc["models"]
    assert e["interleaved"] is False and e["breakeven"]["paired"] is None
    assert e["breakeven"]["crossing_detail"]["paired"] is False
    report = render_report(doc)
    assert "traced on GPU" not in report and "ran back to back in both" not in report
    assert "did not run back to back" in report


def test_the_report_opens_with_the_answer() -> None:
    e = _entry(simulate_sweep(PAPER_LIKE, rng=np.random.default_rng(4)), n_boot=100)
    assert e["answer"].startswith("sim/update: mxfp8 vs bf16: pays off above ")  # words, not the case's id
    assert "[95 % CI" in e["answer"]
    lines = render_report({**_doc(e), "bootstrap": {"resamples": 100}}).splitlines()
    assert lines[2] == f"- **{e['answer']}**"


def test_simulated_scenarios_at_a_few_seeds_are_never_confidently_wrong() -> None:
    for name in ("clean", "outliers", "never", "knee_short"):
        row = summarize(name, run(name, seeds=3, n_boot=100))
        assert row["wrong"] == 0 and row["recommendation_unsupported"] == 0, row
        assert row["recommendation_wrong"] == 0 and row["n_star_without_interval"] == 0, row


def test_the_paired_cross_check_is_said_in_words_and_never_at_zero_tokens() -> None:
    from perfmodel.breakeven.paired import PairedBreakeven
    from perfmodel.report.headline import _paired_words

    def paired(case: str, tokens: float | None) -> PairedBreakeven:
        return PairedBreakeven(3, case, tokens, (None, None), "", 0.0, (0.0, 0.0), 0.0, (0.0, 0.0), "")

    assert (
        _paired_words(paired("faster_below", 88.0), "mxfp8") == "mxfp8 faster below 88 tokens per micro-batch"
    )
    assert _paired_words(paired("faster_below", 0.0), "mxfp8") == "mxfp8 slower at every size (n* <= 0)"
    assert _paired_words(paired("faster_above", -5.0), "mxfp8") == "mxfp8 faster at every size (n* <= 0)"
    for case in ("always_faster", "never_faster", "indistinguishable", "undetermined"):
        assert "_" not in _paired_words(paired(case, None), "mxfp8")
