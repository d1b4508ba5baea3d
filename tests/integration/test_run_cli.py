"""``mxperf run`` end to end: run directory, tables, ranges, checks, bad input, --strict."""

from __future__ import annotations

import json
import os

import pytest

from mxperf.cli import main
from pipeline.experiments.loop import RLLoop, SyncCheckFailedError
from pipeline.experiments.run import execute_run
from pipeline.experiments.session import RunConfig
from tracing.analysis.attribution import split_encoded_name
from tracing.outputs import store
from tracing.outputs.manifest import read_manifest

TINY = [
    "--pretrain-steps",
    "0",
    "--steps",
    "2",
    "--prompts-per-step",
    "2",
    "--samples-per-prompt",
    "2",
    "--max-new-tokens",
    "3",
]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MXPERF_CACHE", str(tmp_path / "cache"))  # never write the user's ~/.cache


def test_run_writes_a_complete_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(
        [
            "run",
            "--model",
            "tiny-dense",
            "--learner",
            "mxfp8",
            "--sampler",
            "mxfp8",
            *TINY,
            "--tokens-per-microbatch",
            "32",
            "-o",
            str(out),
            "--json",
        ]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        summary["status"] == "complete" and summary["run_dir"] == str(out) and summary["schema_version"] == 1
    )
    manifest = read_manifest(out)
    load = manifest["load"]  # issue 33 item 7: machine load at the start and the end of the run
    for when in ("start", "end"):
        assert len(load[when]["loadavg"]) == 3 and load[when]["cpu_count"] == os.cpu_count()
    over = [load[w]["loadavg"][0] > load[w]["cpu_count"] for w in ("start", "end")]
    assert load["exceeded_cores"] == any(over)
    assert manifest["kind"] == "run" and manifest["status"] == "complete"
    assert manifest["compute_dtype"] == "bfloat16" and manifest["config"]["learner"] == "mxfp8"
    assert (manifest["learner_device"], manifest["sampler_device"]) == ("cpu", "cpu")  # --device auto, no GPU
    learner = manifest["engines"]["learner"]
    assert learner["gemm_backend"] == "emulated" and "no low-precision tensor cores" in learner["gemm_reason"]
    metrics = store.read_table(out / store.METRICS)
    assert list(metrics["step"]) == [0, 1]
    for col in (
        "generate_s",
        "logprob_s",
        "update_s",
        "sync_s",
        "sync_check_s",
        "reward_mean",
        "kl_k1",
        "kl_k3",
        "token_mult_prob_error",
        "prob_abs_diff_mean",
        "prob_abs_diff_max",
    ):
        assert col in metrics.columns, col
    assert (metrics["step_s"] >= metrics["update_s"] + metrics["generate_s"]).all()  # phases nest in the step
    ranges = store.read_table(out / store.RANGES)
    assert {"step", "generate", "logprob", "update", "update/microbatch", "sync", "sync/check"} <= set(
        ranges["name"]
    )
    checks = store.read_table(out / store.SYNC_CHECKS)
    assert checks["passed"].all()  # clean run: no false alarm
    assert set(checks["invariant"]) == {f"I{i}" for i in range(1, 8)}
    assert set(checks["step"]) == {-1, 0, 1}
    evals = store.read_table(out / store.EVAL_FIXED_WEIGHTS)
    assert list(evals["when"]) == ["initial", "final"] and (evals["kl_k3"] >= 0).all()
    assert (out / "tokenizer.json").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-5"], "unknown model"),
        (["--learner", "fp4"], "unknown --learner"),
        (["--sampler", "int8"], "unknown --sampler"),
        (["--tokens-per-microbatch", "4"], "smaller than one sequence"),
        (["--grid-fraction", "1.5"], "grid-fraction"),
        (["--grid-fraction", "-0.1"], "grid-fraction"),
        (["--kv-cache", "int4"], "kv-cache"),
        (["--check-sync", "sometimes"], "check-sync"),
        (["--trace", "--steps", "2", "--trace-steps", "1,1,3"], "needs at least 5 steps"),
        (["--trace", "--trace-steps", "1,x,3"], "WAIT,WARMUP,ACTIVE"),
        (["--trace", "--trace-steps", "0,0,0"], "active >= 1"),
        (["--trace-steps", "0,0,1"], "add --trace"),
        (["--trace", "--nsys", "--device", "cpu"], "needs CUDA"),
        (["--lr", "-1"], "--lr must be a finite number > 0"),
        (["--lr", "0"], "--lr must be a finite number > 0"),
        (["--threads", "0"], "--threads must be from 1 to 4096"),
        (["--seed", str(10**20)], "--seed must be at most 2^62"),
        (["--samples-per-prompt", "1"], "--samples-per-prompt must be >= 2"),
        (["--steps", "0"], "--steps must be an integer >= 1"),
        (["--device", "cuda:99"], "--device cuda:99"),
        (["--device", "gpu"], "choose auto | cpu | cuda | cuda:N"),
        (["--gemm", "scaled_mm", "--learner", "fp8-block128", "--device", "cpu"], "fp8-block128"),
        (["--weight-cast", "sometimes"], "unknown --weight-cast"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    rc = main(["run", *args, "-o", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()  # refused before any work or file


def test_a_failed_check_with_strict_stops_the_run_and_marks_it_failed(tmp_path):
    def failing_checker(step, learner, engine, **kw):
        return [
            {
                "step": step,
                "invariant": "I1",
                "name": "grid identity",
                "passed": step < 0,
                "first_failing_tensor": "x",
                "detail": "injected",
                "check_seconds": 0.0,
            }
        ]

    def loop_factory(session, **kw):
        return RLLoop(session, checker=failing_checker, **kw)

    cfg = RunConfig(
        steps=2, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=3, tokens_per_microbatch=32
    )
    with pytest.raises(SyncCheckFailedError, match="I1 failed at step 0"):
        execute_run(cfg, tmp_path / "r", strict=True, loop_factory=loop_factory)
    manifest = read_manifest(tmp_path / "r")
    assert manifest["status"] == "failed" and "I1" in manifest["error"]
    assert len(store.read_table(tmp_path / "r" / store.METRICS)) == 0  # the failed step is not presented


def test_existing_output_is_not_overwritten_without_force(tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    rc = main(["run", *TINY, "-o", str(out)])
    assert rc == 2 and "--force" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "x"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("learner", "sampler", "extra"),
    [
        ("bf16", "bf16", []),
        ("mxfp8", "mxfp8", []),
        ("mxfp8", "bf16", []),
        ("mxfp8", "mxfp8-floor", []),
        ("mxfp8", "mxfp8", ["--grid-fraction", "0.5"]),
        ("mxfp8", "mxfp8", ["--kv-cache", "fp8", "--async"]),
    ],
)
def test_twenty_clean_steps_raise_no_false_alarm(tmp_path, learner, sampler, extra):
    out = tmp_path / "r"
    rc = main(
        [
            "run",
            "--learner",
            learner,
            "--sampler",
            sampler,
            "--steps",
            "20",
            "--prompts-per-step",
            "4",
            "--samples-per-prompt",
            "4",
            "--pretrain-steps",
            "0",
            *extra,
            "-o",
            str(out),
            "--strict",
        ]
    )
    assert rc == 0
    checks = store.read_table(out / store.SYNC_CHECKS)
    assert checks["passed"].all() and set(checks["step"]) == {-1, *range(20)}


def test_trace_flag_writes_a_kineto_trace_with_the_phase_ranges(tmp_path):
    import gzip

    out = tmp_path / "r"
    rc = main(
        [
            "run",
            "--steps",
            "4",
            "--prompts-per-step",
            "1",
            "--samples-per-prompt",
            "2",
            "--max-new-tokens",
            "2",
            "--check-sync",
            "off",
            "--pretrain-steps",
            "0",
            "--trace",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    trace = json.loads(gzip.decompress(store.trace_path(out, 0).read_bytes()))
    names = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    assert {"step", "generate", "logprob", "update", "update/microbatch", "sync"} <= {
        split_encoded_name(n)[0] for n in names
    }
    # the traced names carry the attributes, so an ingest of the trace alone knows each micro-batch
    mb = [split_encoded_name(n)[1] for n in names if n.startswith("update/microbatch[")]
    assert mb and all({"step", "microbatch", "tokens", "precision"} <= set(a) for a in mb)
    # the default window: 2 steps after one skipped and one profiler warm-up step, however long the run
    traced = sorted({int(split_encoded_name(n)[1]["step"]) for n in names if n.startswith("step[")})
    assert traced == [2, 3]
    assert store.read_table(out / store.SYNC_CHECKS).empty  # --check-sync off


def test_trace_steps_trace_only_the_scheduled_steps_and_write_a_capture_manifest(tmp_path):
    import gzip

    out = tmp_path / "r"
    args = ["run", *TINY, "--steps", "4", "--check-sync", "off", "--trace", "--trace-steps", "1,1,2"]
    assert main([*args, "-o", str(out)]) == 0
    trace = json.loads(gzip.decompress(store.trace_path(out, 0).read_bytes()))
    steps = [
        e
        for e in trace["traceEvents"]
        if e.get("cat") == "user_annotation" and split_encoded_name(e["name"])[0] == "step"
    ]
    assert len(steps) == 2  # steps 2 and 3: step 0 skipped, step 1 warmed the profiler up
    ranges = store.read_table(out / store.RANGES)
    assert (ranges["name"] == "step").sum() == 4  # the range log still times every step
    capture = store.read_json(out / store.TRACE_DIR / "capture-rank-0.json")
    assert capture["status"] == "complete" and capture["config"]["wait"] == 1 and capture["steps"] == 4
    manifest = store.read_json(out / store.MANIFEST)
    assert manifest["config"]["trace_schedule"]["active"] == 2


def test_check_sync_first_checks_only_the_initial_push(tmp_path):
    out = tmp_path / "r"
    assert main(["run", *TINY, "--check-sync", "first", "-o", str(out)]) == 0
    checks = store.read_table(out / store.SYNC_CHECKS)
    assert set(checks["step"]) == {-1} and len(checks) == 7
    metrics = store.read_table(out / store.METRICS)
    assert (metrics["checks_run"] == 0).all() and (metrics["sync_check_s"] == 0).all()
