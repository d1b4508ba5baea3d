"""``mxperf sweep``: identical data, interleaving, the microbatches.parquet contract."""

from __future__ import annotations

import itertools
import json
import os

import pandas as pd
import pytest

from mxperf.cli import main
from pipeline.experiments.sweep import SweepConfig, fixed_batch
from tracing.analysis.attribution import split_encoded_name
from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.manifest import read_manifest
from tracing.outputs.schema import MICROBATCH_COLUMNS


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "s"
    rc = main(
        [
            "sweep",
            "--model",
            "tiny-dense",
            "--precisions",
            "bf16,mxfp8",
            "--tokens-per-microbatch",
            "32,64,128",
            "--repeats",
            "2",
            "--warmup",
            "0",
            "--seq-len",
            "32",
            "-o",
            str(out),
            "--json",
        ]
    )
    assert rc == 0
    return out


def test_sweep_writes_the_shared_microbatch_contract(sweep_dir):
    assert read_manifest(sweep_dir)["kind"] == "sweep"
    df = store.read_table(sweep_dir / store.MICROBATCHES)
    assert list(df.columns[: len(MICROBATCH_COLUMNS)]) == list(MICROBATCH_COLUMNS)
    for col, dtype in MICROBATCH_COLUMNS.items():
        assert str(df[col].dtype) == dtype, col
    assert set(df["source"]) == {"sweep"} and set(df["phase"]) == {"update"}
    assert (
        df["gpu_busy_seconds"].isna().all() and df["host_stall_seconds"].isna().all()
    )  # CPU: null, no stand-in
    assert df["mfu"].isna().all()  # unknown hardware peak: never guessed
    assert (df["seconds"] > 0).all() and (df["flops"] > 0).all()
    assert (df["num_tokens"] <= df["tokens_per_microbatch"]).all()
    mem = df.groupby(["precision", "tokens_per_microbatch"])["peak_mem_bytes"].median()
    for prec in ("bf16", "mxfp8"):  # activation memory grows with the micro-batch
        assert mem[(prec, 32)] < mem[(prec, 64)] < mem[(prec, 128)]


def test_every_size_sees_the_same_tokens_per_step(sweep_dir):
    df = store.read_table(sweep_dir / store.MICROBATCHES)
    per_step = df.groupby(["precision", "step"]).agg(
        tokens=("num_tokens", "sum"), size=("tokens_per_microbatch", "first")
    )
    assert per_step["tokens"].nunique() == 1 and per_step["tokens"].iloc[0] == 128
    counts = per_step.groupby("size").size()
    assert counts.to_dict() == {32: 4, 64: 4, 128: 4}  # 2 precisions x 2 repeats, warm-up not recorded
    mb = df[df["tokens_per_microbatch"] == 32].groupby(["precision", "step"]).size()
    assert set(mb) == {4}


def test_precisions_are_interleaved_within_each_size(sweep_dir):
    ranges = store.read_table(sweep_dir / store.RANGES)
    steps = ranges[ranges["name"] == "sweep/step"].sort_values("start_ns")
    attrs = [json.loads(a) for a in steps["attrs"]]
    seq = [(a["repeat"], a["tokens_per_microbatch"], a["precision"]) for a in attrs]
    for i in range(0, len(seq), 2):
        assert seq[i][:2] == seq[i + 1][:2] and {seq[i][2], seq[i + 1][2]} == {"bf16", "mxfp8"}


def test_the_fixed_batch_is_identical_for_identical_config():
    cfg = SweepConfig(sizes=(64,), seq_len=32)
    a, b = fixed_batch(cfg), fixed_batch(cfg)
    assert pd.Series(a.input_ids.flatten().tolist()).equals(pd.Series(b.input_ids.flatten().tolist()))
    assert a.input_ids.shape == (2, 32)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"sizes": (16,), "seq_len": 32}, "smaller than one sequence"),
        ({"precisions": ("fp4",)}, "precision"),
        ({"precisions": ()}, "empty"),
        ({"model": "x"}, "unknown model"),
    ],
)
def test_bad_sweep_config_is_an_input_error(kw, message):
    with pytest.raises(InputError, match=message):
        SweepConfig(**kw)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ("64,abc", "comma-separated"),
        ("128,,256", "empty item"),
        (
            "-128,256",
            "must be an integer >= 1",
        ),  # reaches the config instead of argparse's "expected one argument"
        ("0,256", "must be an integer >= 1"),
    ],
)
def test_bad_sizes_on_the_command_line_exit_2(tmp_path, capsys, sizes, message):
    assert main(["sweep", "--tokens-per-microbatch", sizes, "-o", str(tmp_path / "s")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--threads", "0"], "--threads must be from 1 to 4096"),
        (["--seed", str(10**20)], "--seed must be at most 2^62"),
        (["--device", "cuda:7"], "--device cuda:7"),
        (["--device", "tpu"], "choose auto | cpu"),
        (["--gemm", "fast"], "unknown --gemm"),
        (["--weight-cast", "never"], "unknown --weight-cast"),
        (["--global-batch", "64"], "smaller than the largest size"),
        (["--trace-repeats", "2"], "add --trace"),
    ],
)
def test_bad_device_and_batch_flags_exit_2_before_any_output(tmp_path, capsys, flags, message):
    out = tmp_path / "s"
    assert main(["sweep", "--tokens-per-microbatch", "128", *flags, "-o", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_two_global_batches_share_their_data_and_each_row_says_its_step_tokens(tmp_path):
    out = tmp_path / "g"
    rc = main(
        ["sweep", "--precisions", "bf16", "--tokens-per-microbatch", "32,64", "--global-batch", "64,128",
         "--repeats", "1", "--warmup", "0", "--seq-len", "32", "--weight-cast", "per-microbatch", "-o", str(out)]
    )  # fmt: skip
    assert rc == 0
    df = store.read_table(out / store.MICROBATCHES)
    steps = df.groupby("step").agg(
        tokens=("num_tokens", "sum"), g=("global_tokens", "first"), n=("microbatch", "size")
    )
    assert (steps["tokens"] == steps["g"]).all()
    assert sorted(zip(steps["g"], steps["n"], strict=True)) == [(64, 1), (64, 2), (128, 2), (128, 4)]
    manifest = read_manifest(out)
    assert manifest["config"]["weight_cast"] == "per-microbatch"
    assert manifest["learners"]["bf16"]["gemm_backend"] == "bf16"
    cfg = SweepConfig(sizes=(64,), seq_len=32, global_tokens=(64, 128))
    assert cfg.global_batches == (64, 128) and cfg.num_sequences == 4


def test_traced_sweep_writes_one_trace_and_says_why_gpu_columns_are_empty(tmp_path, capsys):
    import gzip

    out = tmp_path / "s"
    args = ["sweep", "--model", "tiny-dense", "--precisions", "bf16", "--tokens-per-microbatch", "32,64"]
    rc = main([*args, "--repeats", "2", "--warmup", "0", "--seq-len", "32", "--trace", "-o", str(out)])
    assert rc == 0
    trace = json.loads(gzip.decompress(store.trace_path(out, 0).read_bytes()))
    names = [split_encoded_name(e["name"]) for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    mb = [attrs for name, attrs in names if name == "update/microbatch"]
    assert (
        len(mb) == 3
    )  # the last repeat only: 32 -> 2 micro-batches, 64 -> 1 (the profiler's warm-up step dropped)
    assert all({"precision", "step", "microbatch"} <= set(a) for a in mb)  # what gpu_columns matches on
    shaped = [
        e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e.get("args", {}).get("Input Dims")
    ]
    assert shaped  # record_shapes: the ops carry their input shapes
    capture = store.read_json(out / store.TRACE_DIR / "capture-rank-0.json")
    assert capture["status"] == "complete" and capture["cuda_activity"] is False
    manifest = read_manifest(out)
    assert manifest["gpu_reason"].startswith("CPU-only sweep")
    assert (
        manifest["config"]["trace_schedule"]["warmup"],
        manifest["config"]["trace_schedule"]["active"],
    ) == (1, 2)
    table = store.read_table(out / store.MICROBATCHES)
    assert table["gpu_busy_seconds"].isna().all()
    assert table.groupby("repeat")["traced"].all().to_dict() == {0: False, 1: True}
    assert manifest["profiler_overhead"]["cells"] == 2  # the same cells traced and untraced
    assert manifest["learner_device"] == "cpu" and manifest["sampler_device"] is None
    assert main([*args, "--nsys", "-o", str(tmp_path / "n")]) == 2
    assert "add --trace" in capsys.readouterr().err
    # its directory and its trace ingest (per-range GPU time), and point to the table the sweep already has
    for i, src in enumerate([out, store.trace_path(out, 0)]):
        assert main(["ingest", str(src), "-o", str(tmp_path / f"ing{i}")]) == 0
        assert "a sweep already holds its micro-batch table" in capsys.readouterr().err
        assert not (tmp_path / f"ing{i}" / store.MICROBATCHES).exists()


def test_shape_only_models_are_refused_before_an_output_directory_exists(tmp_path, capsys):
    for cmd in (["run", "--steps", "1"], ["sweep", "--tokens-per-microbatch", "256"]):
        out = tmp_path / cmd[0]
        assert main([*cmd, "--model", "qwen3-8b", "-o", str(out)]) == 2
        assert "shape-only" in capsys.readouterr().err
        assert not out.exists()


def test_the_manifest_records_machine_load_at_start_and_end(sweep_dir):
    load = read_manifest(sweep_dir)["load"]
    for when in ("start", "end"):
        assert len(load[when]["loadavg"]) == 3 and load[when]["cpu_count"] == os.cpu_count()
    assert load["start"]["at"] <= load["end"]["at"]
    over = [load[w]["loadavg"][0] > load[w]["cpu_count"] for w in ("start", "end")]
    assert load["exceeded_cores"] == any(over)


def test_neither_precision_always_runs_first(sweep_dir):
    ranges = store.read_table(sweep_dir / store.RANGES)
    steps = ranges[ranges["name"] == "sweep/step"].sort_values("start_ns")
    firsts = [json.loads(a)["precision"] for a in steps["attrs"]][::2]  # the first of each cell's pair
    assert set(firsts) == {"bf16", "mxfp8"}
    assert all(a != b for a, b in itertools.pairwise(firsts))  # alternating cell by cell


def test_pretrain_steps_time_the_warm_start_runs_train_from(tmp_path, monkeypatch):
    """--pretrain-steps N: the sweep's learners start from mxperf run's cached warm start (same cache entry:
    the default 1-2 digit task), not from the random init; 0 keeps the random init."""
    import torch

    from pipeline.experiments.session import build_tokenizer
    from pipeline.experiments.sweep import initial_model
    from pipeline.model.presets import build_model, get_preset
    from pipeline.model.pretrain import PretrainConfig, warm_start
    from pipeline.model.task import AdditionTask

    monkeypatch.setenv("MXPERF_CACHE", str(tmp_path / "cache"))
    preset, task = get_preset("tiny-dense"), AdditionTask(1, 2)
    warm, meta = warm_start(preset, task, build_tokenizer(task), PretrainConfig(steps=2, seed=0))
    assert not meta["cached"]
    cfg = {"model": "tiny-dense", "sizes": (64,), "seq_len": 16}
    got = initial_model(SweepConfig(**cfg, pretrain_steps=2)).state_dict()
    rand = build_model(preset, 0).state_dict()
    same = initial_model(SweepConfig(**cfg, pretrain_steps=0)).state_dict()
    assert list(got) == list(warm.state_dict()) == list(rand) == list(same)
    assert all(torch.equal(got[k], warm.state_dict()[k]) for k in got)
    assert any(not torch.equal(got[k], rand[k]) for k in got)
    assert all(torch.equal(same[k], rand[k]) for k in got)
    out = tmp_path / "sweep"
    flags = ["--tokens-per-microbatch", "64", "--seq-len", "16", "--repeats", "1", "--precisions", "bf16"]
    assert main(["sweep", *flags, "--pretrain-steps", "2", "-o", str(out)]) == 0
    assert read_manifest(out)["config"]["pretrain_steps"] == 2
