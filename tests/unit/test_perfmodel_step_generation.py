"""Generation as prefill + per-generated-token decode cost (issue 33 item 1): fitted on synthetic run folders
whose truth is known, scaled to the query's N (and G), and held at the measured median, with the reason, where
the steps cannot support the fit (too few, collinear, unresolved) or only one precision has a fit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfmodel.inputs.load import load_inputs
from perfmodel.inputs.simulate import simulate_sweep
from perfmodel.report.results import analyze
from perfmodel.step.generation import MIN_STEPS, fit_generation, step_tokens
from perfmodel.step.model import parse_at
from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.manifest import OutputDir

# truth per precision: fixed s, prefill s per prompt token, decode s per generated token
TRUTH = {"bf16": (0.20, 1.0e-4, 2.0e-3), "mxfp8": (0.18, 0.8e-4, 1.5e-3)}


def _tokens(k: int, seed: int, collinear: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1000, 4000, k).astype(float)
    gen = 0.5 * prompt if collinear else rng.integers(200, 1500, k).astype(float)
    return prompt, gen


def _run(
    path: Path,
    prec: str,
    k: int = 24,
    *,
    seed: int = 0,
    collinear: bool = False,
    flat: bool = False,
    prompt_column: bool = False,
) -> Path:
    """A run folder: metrics (generate_s, response_tokens, update_tokens) and logprob ranges whose tokens are
    prompt + generated; generate_s from the truth plus 1 % noise (``flat``: no dependence on tokens)."""
    prompt, gen = _tokens(k, seed, collinear)
    f, a, d = TRUTH[prec]
    rng = np.random.default_rng(seed + 1)
    secs = np.full(k, 3.0) if flat else f + a * prompt + d * gen
    secs = secs * (1 + (0.3 if flat else 0.01) * rng.standard_normal(k))
    metrics = pd.DataFrame(
        {
            "step": range(k),
            "generate_s": secs,
            "response_tokens": gen.astype(int),
            "update_tokens": (prompt + gen).astype(int),
            "num_microbatches": [2] * k,
        }
    )
    if prompt_column:
        metrics["prompt_tokens"] = prompt.astype(int)
    ranges = pd.DataFrame(
        {
            "range_id": range(k),
            "name": ["logprob"] * k,
            "start_ns": np.arange(k) * 10**9,
            "end_ns": np.arange(k) * 10**9 + 1,
            "dur_ns": [1] * k,
            "tid": [1] * k,
            "depth": [1] * k,
            "parent_id": [-1] * k,
            "attrs": [
                json.dumps({"step": i, "tokens": int(p + g) + (999 if prompt_column else 0)})
                for i, (p, g) in enumerate(zip(prompt, gen, strict=True))
            ],
        }
    )
    config = {"model": "sim", "learner": prec, "sampler": prec, "tokens_per_microbatch": 1024}
    with OutputDir(path, kind="run", command=["test"], config=config) as od:
        store.write_table(metrics, od.path / store.METRICS)
        store.write_table(ranges, od.path / store.RANGES)
    return path


class _R:  # the RunFolder fields the fit reads
    def __init__(self, path: Path, prec: str) -> None:
        self.path, self.model, self.sampler = str(path), "sim", prec


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gen") / "sweep"
    with OutputDir(d, kind="sweep", command=["test"]) as od:
        store.write_table(
            simulate_sweep(sizes=(256, 512, 1024, 2048, 4096), repeats=4), od.path / store.MICROBATCHES
        )
    return d


def test_prompt_tokens_are_the_logprob_tokens_less_the_generated_or_the_column(tmp_path) -> None:
    p, g = _tokens(24, 0)
    t = step_tokens(str(_run(tmp_path / "a", "bf16")))
    assert t["prompt_tokens"].tolist() == pytest.approx(p) and t[
        "generated_tokens"
    ].tolist() == pytest.approx(g)
    t = step_tokens(str(_run(tmp_path / "b", "bf16", prompt_column=True)))  # the column wins over the ranges
    assert t["prompt_tokens"].tolist() == pytest.approx(p)
    assert step_tokens(str(tmp_path / "missing")).empty


def test_the_fit_recovers_the_truth_within_its_intervals(tmp_path) -> None:
    for prec in ("bf16", "mxfp8"):
        fit = fit_generation(prec, [_R(_run(tmp_path / prec, prec), prec)], n_boot=400)
        assert fit.used and fit.reason is None and fit.steps == 24
        for true, (lo, hi), est in zip(TRUTH[prec], fit.ci, fit.beta, strict=True):
            assert lo <= true <= hi
            assert est == pytest.approx(true, rel=0.25)
        # N tokens with G generated: prompt N - G; G by default the runs' generated share of N
        p, g = _tokens(24, 0)
        assert fit.generated_share == pytest.approx(float(np.median(g / (p + g))))
        f, a, d = TRUTH[prec]
        assert fit.seconds(10_000, 2_000) == pytest.approx(f + a * 8_000 + d * 2_000, rel=0.03)
        share = fit.generated_share
        assert fit.seconds(10_000) == pytest.approx(
            f + a * 10_000 * (1 - share) + d * 10_000 * share, rel=0.03
        )


def test_too_few_collinear_or_unresolved_steps_are_said_not_fitted(tmp_path) -> None:
    few = fit_generation("bf16", [_R(_run(tmp_path / "few", "bf16", MIN_STEPS - 1), "bf16")])
    assert not few.used and "too few" in few.reason and few.beta is None
    col = fit_generation("bf16", [_R(_run(tmp_path / "col", "bf16", collinear=True), "bf16")])
    assert not col.used and "collinear" in col.reason
    flat = fit_generation(
        "bf16", [_R(_run(tmp_path / "flat", "bf16", flat=True, seed=1), "bf16")], n_boot=200
    )
    assert not flat.used and "do not resolve a positive decode cost" in flat.reason
    none = fit_generation("bf16", [_R(tmp_path / "nothing", "bf16")])
    assert not none.used and "records per-step prompt and generated tokens" in none.reason


def test_an_unresolved_prefill_is_dropped_and_said(tmp_path) -> None:
    """Generate time that does not depend on the prompt (a sampler prefilling each distinct prompt once): the
    fit is fixed + decode, the prefill column 0, and the note says prompt lengths are not scaled."""
    _, gen = _tokens(24, 3)
    path = _run(tmp_path / "noprefill", "bf16", seed=3, prompt_column=True)
    m = store.read_table(path / store.METRICS)
    m["generate_s"] = (0.5 + 2.0e-3 * gen) * (1 + 0.01 * np.random.default_rng(9).standard_normal(24))
    store.write_table(m, path / store.METRICS)
    fit = fit_generation("bf16", [_R(path, "bf16")], n_boot=400)
    assert fit.used and fit.beta[1] == 0.0 and "no positive prefill cost resolved" in fit.note
    lo, hi = fit.ci[2]
    assert lo <= 2.0e-3 <= hi and fit.ci[0][0] <= 0.5 <= fit.ci[0][1]
    assert (fit.boot[:, 1] == 0).all() and "not scaled with prompt length" in fit.words()


def _sm(paths: list[Path], **kw) -> dict:
    return analyze(load_inputs([str(p) for p in paths]), n_boot=200, **kw)["step_model"][0]


def test_the_step_model_scales_generation_with_n_and_g(sweep, tmp_path) -> None:
    runs = [_run(tmp_path / p, p, seed=i) for i, p in enumerate(("bf16", "mxfp8"))]
    sm = _sm([sweep, *runs], at=[(4000, 1000), (8000, 1000), (8000, 1000, 4000)])
    for prec in ("bf16", "mxfp8"):
        g = sm["phases"][prec]["generate"]
        assert g["kind"] == "tokens" and g["scaled"] is True and g["generation_fit"]["used"] is True
        assert "per generated token" in g["source"]
    s4, s8, s8g = sm["settings"]
    for prec in ("bf16", "mxfp8"):
        f, a, d = TRUTH[prec]
        share = sm["phases"][prec]["generate"]["generation_fit"]["generated_share"]
        g4 = s4["per_precision"][prec]["phases_s"]["generate"]
        g8 = s8["per_precision"][prec]["phases_s"]["generate"]
        assert g4 == pytest.approx(f + 4000 * (a * (1 - share) + d * share), rel=0.05)
        assert g8 - g4 == pytest.approx(4000 * (a * (1 - share) + d * share), rel=0.1)  # twice the batch
        assert s8g["per_precision"][prec]["phases_s"]["generate"] == pytest.approx(
            f + a * 4000 + d * 4000, rel=0.05
        )
        assert s8g["generation_tokens"][prec] == {"prompt": 4000.0, "generated": 4000.0}
    assert s8g["gain_ci"][0] <= s8g["gain"] <= s8g["gain_ci"][1]
    assert s8g["generated_tokens"] == 4000 and s4["generated_tokens"] is None
    # validation: generation at each step's own tokens, in-sample (the fit is of the same runs)
    rows = [r for r in sm["validation"]["rows"] if r["phase"] == "generate"]
    assert rows and all(r["kind"] == "in-sample" for r in rows)
    assert all(abs(r["error_pct"]) < 3 for r in rows)


def test_a_fit_for_one_precision_only_is_used_for_neither(sweep, tmp_path) -> None:
    runs = [_run(tmp_path / "bf16", "bf16"), _run(tmp_path / "mxfp8", "mxfp8", k=5)]
    sm = _sm([sweep, *runs])
    for prec in ("bf16", "mxfp8"):
        g = sm["phases"][prec]["generate"]
        assert g["kind"] == "measured" and g["scaled"] is False and not g["generation_fit"]["used"]
    assert (
        "no usable generation fit for mxfp8" in sm["phases"]["bf16"]["generate"]["generation_fit"]["reason"]
    )
    assert "too few" in sm["phases"]["mxfp8"]["generate"]["generation_fit"]["reason"]
    assert "held at the measured median" in sm["phases"]["bf16"]["generate"]["source"]


def test_at_takes_an_optional_generated_count() -> None:
    assert parse_at(["8192,1024,2048;4096,512"]) == [(8192, 1024, 2048), (4096, 512)]
    with pytest.raises(InputError, match="generated tokens exceed"):
        parse_at(["1024,512,2048"])
    with pytest.raises(InputError, match="optionally ,G"):
        parse_at(["1024,512,1,1"])
