"""Real traces from another project's test data, each with a truth read from the file here by plain JSON (not by
mxperf): what mxperf says is right, or it says it cannot know. Provenance: tests/data/real/README.md."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import pytest

from mxperf.cli import main
from tracing.outputs import store

REAL = Path(__file__).parent.parent / "data" / "real"
RESNET_MI300 = REAL / "tracelens_mi300_resnet_act_checkpoint.json.gz"
SGLANG_DECODE = REAL / "tracelens_sglang_qwen3_8b_decode.json.gz"


def _ns(value: object) -> int:
    return int(Decimal(str(value)) * 1000)


def _own_gpu_busy_per_step(path: Path) -> dict[int, int]:
    """Per ProfilerStep#N: the busy time (ns, union) of the GPU ops whose launch call lies in that step."""
    events = [
        e
        for e in json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)["traceEvents"]
        if e.get("ph") == "X"
    ]
    launch = {
        e["args"]["correlation"]: _ns(e["ts"])
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    gpu = [
        (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e["args"].get("correlation"))
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    truth = {}
    for e in events:
        if e.get("cat") != "user_annotation" or not e["name"].startswith("ProfilerStep#"):
            continue
        lo, hi = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
        busy, cur = 0, None
        for a, b in sorted((a, b) for a, b, c in gpu if c in launch and lo <= launch[c] < hi):
            if cur is None or a > cur[1]:
                busy += 0 if cur is None else cur[1] - cur[0]
                cur = [a, b]
            else:
                cur[1] = max(cur[1], b)
        truth[int(e["name"].split("#")[1])] = busy + (0 if cur is None else cur[1] - cur[0])
    return truth


def test_gpu_bound_mi300_resnet_costs_each_step_its_own_gpu_work(tmp_path, capsys):
    """TraceLens' MI300X ResNet (DDP, activation checkpointing, 3 steps): the GPU runs ~30 ms behind the host,
    and the first profiled step's kernels queue behind ops launched before the capture began. Each step's
    cost is the GPU work it launched (18.4-18.9 ms), not its host window (48-53 ms)."""
    truth = _own_gpu_busy_per_step(RESNET_MI300)
    assert sorted(truth) == [15, 16, 17] and all(15e6 < v < 22e6 for v in truth.values())
    out = tmp_path / "o"
    assert main(["ingest", str(RESNET_MI300), "-o", str(out), "--label", "precision=bf16,model=resnet"]) == 0
    err = capsys.readouterr().err
    assert "behind the host" in err and "seconds_basis = device" in err
    assert "sizes not known to be tokens (3 images" in err  # said at ingest, not first at the fit
    mb = store.read_table(out / store.MICROBATCHES)
    assert sorted(mb["step"]) == [15, 16, 17]
    for row in mb.itertuples():
        assert row.seconds_basis == "device" and row.overlap_seconds > 0.02  # the wait is named, not counted
        assert row.seconds == pytest.approx(truth[row.step] / 1e9, rel=0.02)
        assert row.host_seconds > 2 * row.seconds
        assert row.size_unit == "images"  # ten images a step, not tokens
    # the step table on the same basis: each step is its update (the micro-batch found in it), timed on the device
    assert "steps.parquet times its steps and phases on the device" in err
    st = store.read_table(out / store.STEPS).pivot_table(index="step", columns="phase", values="seconds")
    for step, busy in truth.items():
        assert st.loc[step, "update"] == pytest.approx(busy / 1e9, rel=0.02)
        assert st.loc[step, "other"] < 1e-3
    # the fit refuses sizes that are not tokens rather than fitting images as tokens
    assert main(["fit", str(out), "-o", str(tmp_path / "fit")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "are not tokens (3 images" in err[0]


def test_amd_sglang_decode_reads_bf16_hipblaslt_gemms_and_finds_no_microbatches(tmp_path, capsys):
    """TraceLens' sglang Qwen3-8B decode on MI300X: the GEMMs are hipBLASLt ``Cijk_..._BBS_BH_...`` (bf16 in, bf16
    out); decoding is no forward/backward micro-batch, labels or not."""
    names = [
        e["name"]
        for e in json.loads(gzip.decompress(SGLANG_DECODE.read_bytes()))["traceEvents"]
        if e.get("cat") == "kernel"
    ]
    assert any(n.startswith("Cijk_") and "_BBS_" in n for n in names)
    out = tmp_path / "o"
    args = ["ingest", str(SGLANG_DECODE), "-o", str(out), "--json"]
    assert main([*args, "--label", "precision=bf16,model=qwen3-8b,tokens_per_microbatch=16"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["traces"][0]["microbatches"] == 0 and not (out / store.MICROBATCHES).exists()
    evidence = store.read_json(out / store.MANIFEST)["traces"][0]["precision_evidence"]
    assert (evidence["precision"], evidence["family"]) == ("bf16", "bf16") and evidence["share"] > 0.99


def _events(path: Path) -> list[dict]:
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    return [e for e in (doc["traceEvents"] if isinstance(doc, dict) else doc) if e.get("ph") == "X"]


def test_amd_mi250_toy_training_step_is_one_microbatch_holding_its_backward(tmp_path, capsys):
    """HTA's MI250 toy training trace (ROCm 6.2): one forward (linear, relu, mse_loss) and its backward on the
    autograd thread inside ProfilerStep#1; ProfilerStep#2 is empty. One micro-batch, holding that backward."""
    path = REAL / "hta_mi250_minitoy_train.json.gz"
    events = _events(path)
    backward = [
        e for e in events if e.get("cat") == "cpu_op" and str(e["name"]).startswith("autograd::engine")
    ]
    assert backward and len({e["tid"] for e in backward}) == 1  # the autograd thread
    bw_lo = min(_ns(e["ts"]) for e in backward)
    bw_hi = max(_ns(e["ts"]) + _ns(e["dur"]) for e in backward)
    out = tmp_path / "o"
    args = [
        "ingest",
        str(path),
        "-o",
        str(out),
        "--label",
        "precision=bf16,model=toy,tokens_per_microbatch=64",
    ]
    assert main(args) == 0
    capsys.readouterr()
    mb = store.read_table(out / store.MICROBATCHES)
    assert len(mb) == 1 and mb["phase"].iloc[0] == "update"
    step1 = next(e for e in events if e.get("cat") == "user_annotation" and e["name"] == "ProfilerStep#1")
    ranges = store.read_table(out / store.RANGES)
    offset = int(ranges.loc[ranges["name"] == "ProfilerStep#1", "start_ns"].iloc[0]) - _ns(step1["ts"])
    lo, hi = int(mb["start_ns"].iloc[0]) - offset, int(mb["end_ns"].iloc[0]) - offset  # the file's clock
    assert lo <= bw_lo and bw_hi <= hi


def test_amd_bert_inference_is_no_microbatch_and_says_why(tmp_path, capsys):
    """TraceLens' BERT-small on MI300X: one forward in ProfilerStep#6, no backward anywhere in the file (no
    autograd op): inference, so no training micro-batch even with every label given."""
    events = _events(REAL / "tracelens_mi300_bert_small_inference.json.gz")
    ops = [str(e["name"]) for e in events if e.get("cat") in ("cpu_op", "kernel")]
    assert ops and not any("backward" in n.lower() or n.startswith("autograd::") for n in ops)
    out = tmp_path / "o"
    args = ["ingest", str(REAL / "tracelens_mi300_bert_small_inference.json.gz"), "-o", str(out), "--json"]
    assert main([*args, "--label", "precision=bf16,model=bert,tokens_per_microbatch=128"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1])["traces"][0]["microbatches"] == 0
    assert "no backward pass" in captured.err and "inference" in captured.err
    assert not (out / store.MICROBATCHES).exists()
