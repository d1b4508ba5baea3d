"""verl metric logs' token counts feed the step model's generation fit: ``mxperf ingest`` of logs whose
generate times are built from a known fixed / prefill / decode truth, then ``mxperf fit`` with a sweep; a log
without token counts keeps the measured median and says why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mxperf.cli import main
from perfmodel.inputs.ingest_steps import phase_sources
from perfmodel.inputs.simulate import simulate_sweep
from tracing.outputs import store
from tracing.outputs.manifest import OutputDir

# truth per precision: fixed s, prefill s per prompt token, decode s per generated token
TRUTH = {"bf16": (2.0, 5.0e-5, 3.0e-4), "mxfp8": (1.8, 4.0e-5, 2.2e-4)}
SEQUENCES = 64  # a power of two: the length means verl logs are exact in binary
STEPS = 12


def _verl_line(step: int, prompt: int, gen: int, gen_s: float, *, tokens: bool) -> str:
    """One verl FileLogger line (metric_utils.py keys); ``tokens``: with the keys the token counts come from."""
    timers = {"timing_s/gen": gen_s, "timing_s/old_log_prob": 2.0, "timing_s/update_actor": 5.0}
    data: dict[str, float] = {**timers, "timing_s/update_weights": 0.8, "timing_s/step": gen_s + 8.5}
    if tokens:
        total = prompt + gen
        data |= {
            "prompt_length/mean": prompt / SEQUENCES,
            "response_length/mean": gen / SEQUENCES,
            "timing_per_token_ms/gen": gen_s * 1000 / gen,
            "timing_per_token_ms/update_actor": 5.0 * 1000 / total,
            "perf/total_num_tokens": total,
        }
    return json.dumps({"step": step, "data": data}, separators=(",", ":"))


def _log(path: Path, prec: str, *, seed: int, tokens: bool = True) -> Path:
    """A verl log of STEPS steps: prompt and generated tokens drawn apart, generate = truth + 0.5 % noise."""
    rng = np.random.default_rng(seed)
    f, a, d = TRUTH[prec]
    prompt = rng.integers(6_000, 14_000, STEPS)
    gen = rng.integers(12_000, 36_000, STEPS)
    secs = (f + a * prompt + d * gen) * (1 + 0.005 * rng.standard_normal(STEPS))
    lines = [
        _verl_line(i + 1, int(p), int(g), float(s), tokens=tokens)
        for i, (p, g, s) in enumerate(zip(prompt, gen, secs, strict=True))
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gen") / "sweep"
    with OutputDir(d, kind="sweep", command=["test"]) as od:
        store.write_table(
            simulate_sweep(sizes=(256, 512, 1024, 2048, 4096), repeats=3), od.path / store.MICROBATCHES
        )
    return d


def _ingest(tmp: Path, prec: str, *, tokens: bool = True) -> Path:
    log = _log(tmp / "logs" / f"{prec}.jsonl", prec, seed=len(prec), tokens=tokens)
    out = tmp / f"ingest-{prec}"
    assert main(["ingest", str(log), "-o", str(out), "--label", f"model=sim,precision={prec}"]) == 0
    return out


AT = (40_000, 2_048, 28_000)  # --at N,n,G: N tokens per step, G of them generated


def _fit(tmp: Path, sweep: Path, ingests: list[Path]) -> tuple[dict, str]:
    """``mxperf fit`` of the sweep and the ingests at AT: the step model and the report."""
    out = tmp / "fit"
    at = ",".join(map(str, AT))
    assert (
        main(["fit", str(sweep), *map(str, ingests), "-o", str(out), "--bootstrap", "400", "--at", at]) == 0
    )
    sm = json.loads((out / store.FITS).read_text())["step_model"][0]
    return sm, (out / store.REPORT).read_text()


def test_a_metric_logs_token_counts_are_its_generation_rows(tmp_path) -> None:
    folder = _ingest(tmp_path, "bf16")
    (src,), _ = phase_sources(folder, json.loads((folder / store.MANIFEST).read_text()))
    rows = src.generation
    assert list(rows.columns) == ["step", "prompt_tokens", "generated_tokens", "generate_s"]
    assert len(rows) == STEPS
    f, a, d = TRUTH["bf16"]
    truth = f + a * rows["prompt_tokens"] + d * rows["generated_tokens"]
    assert np.allclose(rows["generate_s"], truth, rtol=0.02)  # each step's own generate time with its tokens
    assert rows["generate_s"].tolist() == pytest.approx(src.phases["generate"])


def test_fit_recovers_the_logs_generation_truth_within_its_intervals(sweep, tmp_path) -> None:
    sm, report = _fit(tmp_path, sweep, [_ingest(tmp_path, p) for p in ("bf16", "mxfp8")])
    (setting,) = sm["settings"]
    big_n, _, gen = AT
    for prec, truth in TRUTH.items():
        g = sm["phases"][prec]["generate"]
        fit = g["generation_fit"]
        assert g["kind"] == "tokens" and g["scaled"] is True and fit["used"] is True, fit["reason"]
        assert fit["steps"] == STEPS and len(fit["runs"]) == 1 and f"ingest-{prec}" in fit["runs"][0]
        keys = ("fixed", "prefill_per_token", "decode_per_token")
        for key, true in zip(keys, truth, strict=True):
            lo, hi = fit[f"{key}_ci"]
            assert lo <= true <= hi, (prec, key, lo, true, hi)
            assert fit[f"{key}_s"] == pytest.approx(true, rel=0.25)
        f, a, d = truth  # at the asked batch: N - G prompt tokens, G generated
        assert setting["generation_tokens"][prec] == {"prompt": big_n - gen, "generated": gen}
        assert setting["per_precision"][prec]["phases_s"]["generate"] == pytest.approx(
            f + a * (big_n - gen) + d * gen, rel=0.02
        )
    assert "per generated token" in report and "held at the measured median" not in report


def test_a_log_without_token_counts_keeps_the_measured_median_and_says_why(sweep, tmp_path) -> None:
    ingests = [_ingest(tmp_path, p, tokens=False) for p in ("bf16", "mxfp8")]
    assert not (ingests[0] / store.STEP_TOKENS).exists()
    sm, report = _fit(tmp_path, sweep, ingests)
    (setting,) = sm["settings"]
    for prec, folder in zip(("bf16", "mxfp8"), ingests, strict=True):
        g = sm["phases"][prec]["generate"]
        assert g["kind"] == "measured" and g["scaled"] is False and not g["generation_fit"]["used"]
        logged = store.read_table(folder / store.STEPS).query("phase == 'generate'")["seconds"]
        assert len(logged) == STEPS and g["seconds"] == pytest.approx(float(np.median(logged)))
        assert setting["per_precision"][prec]["phases_s"]["generate"] == pytest.approx(g["seconds"])
        reason = g["generation_fit"]["reason"]
        assert reason.startswith("no run folder or metric log records per-step prompt and generated tokens")
        line = (
            f"median over {STEPS} steps of {folder}; held at the measured median, not scaled with N: {reason}"
        )
        assert line in report


def test_without_at_the_global_batch_is_the_logs_own_tokens_per_step(sweep, tmp_path) -> None:
    """No --at, no --global-batch: N is the median prompt + generated tokens per step the logs count, and the
    answer names it; never invented."""
    ingests = [_ingest(tmp_path, p) for p in ("bf16", "mxfp8")]
    out = tmp_path / "fit-no-at"
    assert main(["fit", str(sweep), *map(str, ingests), "-o", str(out), "--bootstrap", "200"]) == 0
    sm = json.loads((out / store.FITS).read_text())["step_model"][0]
    per_log = []
    for prec in ("bf16", "mxfp8"):
        lines = (tmp_path / "logs" / f"{prec}.jsonl").read_text().splitlines()
        per_log.append(float(np.median([json.loads(x)["data"]["perf/total_num_tokens"] for x in lines])))
    assert sm["global_tokens"] == round(float(np.median(per_log)))
    assert "the tokens per step the logs of" in sm["global_tokens_source"]
    assert sm["recommendation"]["global_tokens"] == sm["global_tokens"]


def test_phase_times_from_logs_that_do_not_say_their_hardware_are_warned_about(sweep, tmp_path) -> None:
    """A sweep measured on this machine plus verl logs (no hardware recorded): the answer's first line warns
    that the step adds them as if measured on one machine; fits.json keeps the sentence."""
    ingests = [_ingest(tmp_path, p) for p in ("bf16", "mxfp8")]
    sm, _ = _fit(tmp_path, sweep, ingests)
    doc = json.loads((tmp_path / "fit" / store.FITS).read_text())
    assert "do not record their hardware" in doc["hardware_warning"]
    assert doc["hardware_warning"] in sm["answer"][0] and "measured on CPU" in sm["answer"][0]
