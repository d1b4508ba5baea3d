"""The whole-step gain's 95 % interval on simulations with known per-phase, per-precision truth (issue 33 must
show 2): a faster MXFP8 sampler, a weight cast paid once per step, dynamic batching and response lengths, a
memory cap. The interval covers the true gain in >= 93 % of >= 100 seeds (slow test; 30 seeds at >= 85 % in
the default suite), and the order of the inputs never changes the answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfmodel.inputs.load import load_inputs
from perfmodel.inputs.simulate import Truth, simulate_sweep
from perfmodel.report.results import analyze
from tracing.outputs import store
from tracing.outputs.manifest import OutputDir

SIZES = (512, 1024, 2048, 4096, 8192)
GLOBALS = (16_384, 32_768)  # two global batches: the per-step cast is identified apart from the fixed cost
# update per micro-batch: mxfp8 adds 15 ms fixed, saves 2 us per token, and casts its weights once per step
UPDATE = {"bf16": Truth(0.010, 4e-6), "mxfp8": Truth(0.025, 2e-6, per_step_s=0.040)}
# generate per step = fixed + prefill x prompt tokens + decode x generated tokens: mxfp8's sampler is faster
GENERATE = {"bf16": (0.20, 2.0e-5, 4.0e-4), "mxfp8": (0.20, 1.6e-5, 3.0e-4)}
SYNC = {"bf16": 0.30, "mxfp8": 0.25}
STEPS = 24  # run steps per precision (the generation fit needs >= 8 and resolves prefill here)
BIG_N, N, G = 65_536, 2_048, 8_192  # the user's settings: tokens per step, per micro-batch, generated
MEM_CAP = 6_000  # tokens per micro-batch that fit
CAP_BYTES = 50 * 2**20 + 4096 * MEM_CAP  # the simulated sweep's peak memory: 50 MiB + 4 kiB per token


def true_gain() -> float:
    """1 - step_mxfp8 / step_bf16 at (BIG_N, N, G), from the truth alone."""

    def step(p: str) -> float:
        u, (g0, gp, gd) = UPDATE[p], GENERATE[p]
        k = BIG_N // N
        return k * (u.fixed_s + u.per_token_s * N) + u.per_step_s + g0 + gp * (BIG_N - G) + gd * G + SYNC[p]

    return 1.0 - step("mxfp8") / step("bf16")


def _run(path: Path, p: str, rng: np.random.Generator) -> Path:
    """A run folder of precision ``p``: per step generate (dynamic prompt and response lengths) and sync."""
    prompt = rng.integers(20_000, 60_000, STEPS)
    gen = rng.integers(2_000, 16_000, STEPS)
    g0, gp, gd = GENERATE[p]
    metrics = pd.DataFrame(
        {
            "step": range(STEPS),
            "generate_s": (g0 + gp * prompt + gd * gen) * (1 + 0.03 * rng.standard_normal(STEPS)),
            "sync_s": SYNC[p] * (1 + 0.03 * rng.standard_normal(STEPS)),
            "prompt_tokens": prompt,
            "response_tokens": gen,
        }
    )
    config = {"model": "sim", "learner": p, "sampler": p, "tokens_per_microbatch": N}
    with OutputDir(path, kind="run", command=["test"], config=config) as od:
        store.write_table(metrics, od.path / store.METRICS)
    return path


def _folders(d: Path, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    df = simulate_sweep(UPDATE, sizes=SIZES, repeats=3, global_tokens=GLOBALS, dynamic=True, rng=rng)
    sweep = d / "sweep"
    with OutputDir(sweep, kind="sweep", command=["test"]) as od:
        store.write_table(df, od.path / store.MICROBATCHES)
    return [str(sweep), *(str(_run(d / f"run-{p}", p, rng)) for p in ("bf16", "mxfp8"))]


def _entry(paths: list[str], seed: int, n_boot: int = 200) -> dict:
    doc = analyze(load_inputs(paths), n_boot=n_boot, seed=seed, at=[(BIG_N, N, G)], mem_cap_bytes=CAP_BYTES)
    (sm,) = doc["step_model"]
    return sm


def _coverage(tmp_path: Path, seeds: range) -> tuple[float, list[str]]:
    truth, hits, why = true_gain(), [], []
    for seed in seeds:
        sm = _entry(_folders(tmp_path / str(seed), seed), seed)
        s = sm["settings"][0]
        lo, hi = s["gain_ci"]
        hits.append(lo <= truth <= hi)
        assert all(sm["phases"][p]["generate"]["scaled"] for p in ("bf16", "mxfp8")), sm["phases"]
        rec = sm.get("recommendation") or {}
        for p, r in (rec.get("per_precision") or {}).items():
            if r.get("tokens_per_microbatch") is not None and r["tokens_per_microbatch"] > MEM_CAP:
                why.append(f"seed {seed}: {p} recommended {r['tokens_per_microbatch']} > cap {MEM_CAP}")
    return float(np.mean(hits)), why


def test_the_truth_has_the_papers_shape() -> None:
    # a faster sampler and cheaper tokens outweigh the added fixed and per-step costs at these settings
    assert 0.05 < true_gain() < 0.30


def test_the_step_gain_interval_covers_the_truth(tmp_path) -> None:
    cov, over_cap = _coverage(tmp_path, range(30))
    assert cov >= 0.85, cov
    assert not over_cap, over_cap


@pytest.mark.slow
def test_the_step_gain_interval_covers_the_truth_over_120_seeds(tmp_path) -> None:
    cov, over_cap = _coverage(tmp_path, range(120))
    assert cov >= 0.93, cov
    assert not over_cap, over_cap


def test_the_order_of_the_inputs_never_changes_the_answer(tmp_path) -> None:
    paths = _folders(tmp_path, 7)
    a = _entry(paths, 7)
    b = _entry(list(reversed(paths)), 7)
    assert a["settings"] == b["settings"] and a["recommendation"] == b["recommendation"]
