"""vLLM as the live sampler (marker ``vllm``): the real engine in its own process, started from this venv with
``.venv-vllm``'s python (``bash scripts/make_vllm_venv.sh``). Run: ``.venv/bin/python -m pytest -m vllm
tests/integration/test_vllm_engine.py``.

One engine serves the whole module (start-up ~20-30 s on this machine). The RL test comes first: it needs
the engine's first version to be 0.
"""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.engines.vllm.client import VllmUnavailableError, vllm_python
from pipeline.interfaces import SamplingParams

pytestmark = pytest.mark.vllm

# Stated tolerance at fixed weights: vLLM BF16 kernels vs the learner's BF16-autocast forward.
LOGPROB_MAX_ABS = 0.1
LOGPROB_MEAN_ABS = 0.02


@pytest.fixture(scope="module")
def engine():
    try:
        vllm_python()
    except VllmUnavailableError as exc:
        pytest.skip(str(exc))
    from pipeline.engines.vllm.client import VllmSampler
    from pipeline.model.presets import build_config, build_model, get_preset

    preset = get_preset("tiny-dense")
    eng = VllmSampler(
        build_config(preset), "bf16", eos_id=1, initial_weights=build_model(preset, seed=1).state_dict()
    )
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def learner():
    from pipeline.learner.engine import HFLearner
    from pipeline.model.presets import build_model, get_preset

    return HFLearner(build_model(get_preset("tiny-dense"), seed=0), "bf16")


def _sync_and_check(learner, engine, rollouts=(), step=0):
    from pipeline.sync.invariants import check_sync
    from pipeline.sync.weight_sync import WeightSync

    sync = WeightSync()
    sync.sync(learner, engine, engine.weight_version + 1)
    return {
        r.invariant: r for r in check_sync(step, learner, engine, rollouts=list(rollouts), report=sync.last)
    }


def test_three_rl_steps_with_vllm_sampler_pass_every_check(engine) -> None:
    from pipeline.experiments.loop import RLLoop
    from pipeline.experiments.session import RunConfig, Session

    assert engine.weight_version == -1, "run this test first (it starts the version count at 0)"
    session = Session(RunConfig(steps=3, prompts_per_step=4, samples_per_prompt=4, max_new_tokens=5))
    assert session.tokenizer.eos_id == engine.eos_id
    session.sampler = engine
    loop = RLLoop(session, check_sync="every", strict=True)
    rows = loop.initial_sync()
    metrics = []
    for step in range(3):
        result = loop.step(step)
        rows += result.check_rows
        metrics.append(result.metrics)
    assert len(rows) == 4 * 7
    assert all(r["passed"] for r in rows), [r for r in rows if not r["passed"]][:2]
    assert engine.weight_version == 3
    for m in metrics:
        assert m["checks_failed"] == 0 and m["mixed_version_sequences"] == 0
        # sampler (vLLM) vs learner on the same tokens: near-identical policies at BF16.
        assert 1.0 <= m["token_mult_prob_error"] < 1.05


def test_pushed_weights_read_back_bit_exact_through_the_kernels(engine, learner) -> None:
    rows = _sync_and_check(learner, engine)
    assert rows["I1"].passed, rows["I1"].detail
    live = engine.read_back()
    exported = learner.export_weights(lambda name: False)
    qkv = torch.cat([exported[f"model.layers.2.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(live["model.layers.2.self_attn.qkv_proj.weight"], qkv)
    assert torch.equal(live["lm_head.weight"], exported["lm_head.weight"])
    assert all(r.passed for r in rows.values()), {k: r.detail for k, r in rows.items() if not r.passed}


def test_vllm_logprobs_match_the_learner_at_fixed_weights(engine, learner) -> None:
    from pipeline.learner.rollouts import pad_sequences, place_logprobs

    _sync_and_check(learner, engine)
    prompts = [[5 + i, 17, 30 + 2 * i, 9] for i in range(8)]
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=8, seed=11))
    assert all(len(r.response_ids) == len(r.logprobs) > 0 for r in rollouts)
    ids, am, rm = pad_sequences([r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts], 0)
    lp_learner = learner.logprobs(ids, am)
    lp_vllm = place_logprobs(
        [len(r.prompt_ids) for r in rollouts], [r.logprobs for r in rollouts], rm.shape[1]
    )
    diff = (lp_learner - lp_vllm).abs()[rm.bool()]
    assert float(diff.max()) < LOGPROB_MAX_ABS
    assert float(diff.mean()) < LOGPROB_MEAN_ABS
    assert all(math.isfinite(x) and x <= 0 for r in rollouts for x in r.logprobs)


def test_teacher_forced_score_matches_the_sampled_logprobs_and_the_learner(engine, learner) -> None:
    from pipeline.experiments.loop import evaluate_pairing

    _sync_and_check(learner, engine)
    prompts = [[5 + i, 17, 30 + 2 * i, 9] for i in range(6)]
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=6, seed=3))
    scored = engine.score(prompts, [r.response_ids for r in rollouts])
    for r, lp in zip(rollouts, scored, strict=True):
        assert len(lp) == len(r.logprobs)  # one log-prob per response token, the response part only
        # the same tokens, one prefill instead of prefill + decode steps: equal up to BF16 GEMM shape effects
        assert max(abs(a - b) for a, b in zip(lp, r.logprobs, strict=True)) < LOGPROB_MAX_ABS
    # what `mxperf run` records as eval_fixed_weights: learner vs vLLM on given responses
    m = evaluate_pairing(learner, engine, prompts, [r.response_ids for r in rollouts], pad_id=0)
    assert 0 <= m["kl_k3"] < 1e-2 and 1.0 <= m["token_mult_prob_error"] < 1.05


def test_same_seed_reproduces_the_same_rollouts(engine, learner) -> None:
    _sync_and_check(learner, engine)
    params = SamplingParams(max_new_tokens=6, seed=5)
    a = engine.generate([[3, 4, 5]] * 3, params)
    b = engine.generate([[3, 4, 5]] * 3, params)
    assert [r.response_ids for r in a] == [r.response_ids for r in b]


@pytest.mark.parametrize(
    "fault", ["vllm-stale-prefix-cache", "vllm-partial-push", "vllm-gate-up-swapped-names"]
)
def test_vllm_fault_is_caught_by_its_invariant(engine, learner, fault: str) -> None:
    from pipeline.engines.vllm.faults import get_vllm_fault

    f = get_vllm_fault(fault)
    rows = _sync_and_check(learner, engine)  # a clean version first: the fault acts from the next push on
    assert all(r.passed for r in rows.values())
    f.apply(engine)
    try:
        rollouts = engine.generate([[7, 8, 9, 10]] * 2, SamplingParams(max_new_tokens=4, seed=1))
        learner.model.lm_head.weight.data.mul_(1.001)  # new weights, so stale rows differ from fresh ones
        rows = _sync_and_check(learner, engine, rollouts)
        assert not rows[f.invariant].passed, f"{fault} not caught by {f.invariant}"
    finally:
        engine.reset_prefix_cache_on_load = True
        engine.__dict__.pop("transform_push", None)
    rows = _sync_and_check(learner, engine)
    assert all(r.passed for r in rows.values()), "engine did not recover after removing the fault"


def test_weight_only_grid_sampler_holds_the_learners_mxfp8_values() -> None:
    """mode mxfp8 on CPU vLLM: an MXFP8 learner's bytes, dequantized exactly, are what the kernels use."""
    try:
        vllm_python()
    except VllmUnavailableError as exc:
        pytest.skip(str(exc))
    from pipeline.engines.vllm.checks import check_sync_vllm, make_vllm_weight_sync
    from pipeline.engines.vllm.client import VllmSampler
    from pipeline.learner.engine import HFLearner
    from pipeline.model.presets import build_config, build_model, get_preset

    preset = get_preset("tiny-dense")
    mx_learner = HFLearner(build_model(preset, seed=0), "mxfp8")
    with VllmSampler(build_config(preset), "mxfp8", eos_id=1) as eng:
        assert eng.manifest_info()["weight_grid"] == "weight-only"
        sync = make_vllm_weight_sync()
        sync.sync(mx_learner, eng, 0)
        assert sync.last.num_quantized > 0  # bytes + scales went over the wire
        rows = {r.invariant: r for r in check_sync_vllm(0, mx_learner, eng, report=sync.last)}
        assert all(r.passed for r in rows.values()), {k: r.detail for k, r in rows.items() if not r.passed}
        assert "weight-only" in rows["I1"].detail
        # and the grid is really the learner's: a BF16 (off-grid) push fails the same I1
        bf16_learner = HFLearner(build_model(preset, seed=0), "bf16")
        make_vllm_weight_sync().sync(bf16_learner, eng, 1)
        rows = {r.invariant: r for r in check_sync_vllm(1, mx_learner, eng)}
        assert not rows["I1"].passed


def test_traced_run_with_vllm_sampler_traces_the_engine_process_and_ingest_finds_it(tmp_path) -> None:
    """`mxperf run --sampler-engine vllm --trace`: vLLM's own profiler is bracketed with the traced steps, its
    Kineto trace lands in trace/sampler/, and ingesting the run directory maps its engine steps to generate."""
    try:
        vllm_python()
    except VllmUnavailableError as exc:
        pytest.skip(str(exc))
    from mxperf.cli import main
    from tracing.outputs import store

    run = tmp_path / "run"
    args = ["run", "--sampler-engine", "vllm", "--steps", "3", "--prompts-per-step", "2"]
    args += ["--samples-per-prompt", "2", "--max-new-tokens", "3", "--pretrain-steps", "0"]
    assert main([*args, "--trace", "--trace-steps", "1,1,1", "-o", str(run)]) == 0
    capture = store.read_json(run / store.TRACE_DIR / "capture-rank-0.json")
    (sampler_trace,) = capture["companion_files"]  # one start/stop: step 2 only
    assert sampler_trace.startswith("trace/sampler/") and (run / sampler_trace).is_file()
    out = tmp_path / "ingest"
    assert main(["ingest", str(run), "-o", str(out)]) == 0
    ranges = store.read_table(out / store.RANGES)
    engine = ranges[ranges["trace"].str.contains("/trace/sampler/")]
    steps = engine[engine["name"].str.startswith("execute_context_")]
    assert len(steps) >= 3 and (steps["phase"] == "generate").all()  # a prefill + decode steps of step 2
    learner = ranges[ranges["trace"].str.endswith("rank-0.json.gz")]
    assert (learner["name"] == "generate").sum() == 1  # the learner process traced the same single step
