"""Issue 32: a micro-batch's cost on the basis that measures it, and sizes that say what they count.

Simulated traces (``tests/synthetic_traces.py``) know each micro-batch's host window, the GPU ops it launched
and the end of the GPU work queued before it, so the truth of both bases is read from the simulation, not
from mxperf.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest
import synthetic_traces as st

from perfmodel.inputs.columns import conform_microbatches
from tracing.analysis import attribution
from tracing.analysis.microbatches import find_microbatches
from tracing.ingest.detect import load_trace
from tracing.outputs.errors import InputError
from tracing.outputs.labels import Labels


def _found(rank: st.Rank, tmp_path, labels: Labels | None = None):
    path = st.write_kineto(rank, tmp_path / "rank-0.json.gz")
    trace = load_trace(path)
    return find_microbatches(trace, attribution.attribute_ranges(trace), labels)


def _merged(rank: st.Rank, table: pd.DataFrame) -> pd.DataFrame:
    truth = pd.DataFrame(
        [
            {
                "phase": t.phase,
                "step": t.step,
                "microbatch": t.microbatch,
                "host_s": t.seconds,
                "device_s": t.device_seconds,
                "busy_s": t.gpu_busy_seconds,
                "lag_s": max(0, t.queued_end_ns - t.start_ns) / 1e9,
            }
            for t in rank.truth
        ]
    )
    merged = table.merge(truth, on=["phase", "step", "microbatch"])
    assert len(merged) == len(truth) == len(table)
    return merged


def test_gpu_bound_without_syncs_takes_the_device_completion_interval(tmp_path):
    """No sync between update micro-batches: the host runs several micro-batches ahead of the GPU, so each host
    window holds the earlier micro-batches' GPU work; the completion interval is the micro-batch's own."""
    steps = ((2048, 1024, 4096, 2048, 512, 3072, 1024),)
    rank = st.simulate(st.Job(steps=steps, logprob=False, sync_per_microbatch=False))
    found = _found(rank, tmp_path)
    m = _merged(rank, found.table)
    later = m[m["microbatch"] > 0]
    # the premise: the GPU lags the host by more than one micro-batch's GPU time
    assert (later["lag_s"] > later["busy_s"]).sum() >= 3
    assert set(m["seconds_basis"]) == {"device"}
    assert ((m["seconds"] / m["device_s"] - 1).abs() < 0.01).all()
    # a serial compute stream: the completion interval is the GPU time of the micro-batch's own work ...
    assert ((later["seconds"] / later["busy_s"] - 1).abs() < 0.02).all()
    assert ((m["gpu_busy_seconds"] / m["busy_s"] - 1).abs() < 0.01).all()  # ... none of earlier work
    # ... while the host window beside it holds the wait for earlier micro-batches' work
    assert ((m["host_seconds"] / m["host_s"] - 1).abs() < 0.01).all()
    assert (later["host_seconds"] > 1.5 * later["seconds"]).sum() >= 3
    assert ((later["overlap_seconds"] - later["lag_s"]).abs() < 0.05 * later["lag_s"]).all()
    note = next(n for n in found.notes if n["phase"] == "update")
    assert any("behind the host" in p and "seconds_basis = device" in p for p in note["problems"])
    # the fit takes these rows: their seconds hold no wait for earlier work
    from perfmodel.fitting.fit_all import overlap_reason

    assert overlap_reason(conform_microbatches(found.table, "t", "range")) is None
    assert overlap_reason(conform_microbatches(found.table.assign(seconds_basis="host"), "t", "range"))


def test_host_bound_keeps_the_host_window(tmp_path):
    """Kernels far shorter than their launches: the GPU waits for the host, the window holds no earlier work."""
    tiny = st.Costs(
        gemm_per_token=0.2, gemm_fixed=800, attn_per_token=0.2, elem_per_token=0.1, elem_fixed=800
    )
    steps = ((2048, 1024, 4096),)
    rank = st.simulate(st.Job(steps=steps, logprob=False, sync_per_microbatch=False, costs=tiny))
    found = _found(rank, tmp_path)
    m = _merged(rank, found.table)
    assert set(m["seconds_basis"]) == {"host"}
    assert ((m["seconds"] / m["host_s"] - 1).abs() < 0.01).all()
    # the first waits for zero_grad's kernel: computed and noted, but the GPU keeps up with the rest
    assert ((m["overlap_seconds"] - m["lag_s"]).abs() < 2e-6).all() and (m["lag_s"] > 0).sum() == 1
    note = next(n for n in found.notes if n["phase"] == "update")
    assert any("1 of 3 start while" in p and "seconds_basis = host" in p for p in note["problems"])
    assert (m["gpu_busy_seconds"] < 0.5 * m["seconds"]).all()  # the GPU idles: host-bound
    assert ((m["gpu_busy_seconds"] / m["busy_s"] - 1).abs() < 0.01).all()


def test_sizes_that_are_not_tokens_are_refused_by_the_fit_unless_labelled():
    rows = pd.DataFrame(
        {
            "model": "m",
            "precision": "bf16",
            "tokens_per_microbatch": [10, 20, 30],
            "seconds": [0.1, 0.2, 0.3],
            "size_unit": ["images", "images", "images"],
        }
    )
    with pytest.raises(InputError, match=r"not tokens.*3 images.*--label tokens_per_microbatch"):
        conform_microbatches(rows, "t", "range")
    assert len(conform_microbatches(rows.assign(size_unit="tokens"), "t", "range")) == 3
    assert len(conform_microbatches(rows.drop(columns="size_unit"), "t", "range")) == 3  # a sweep's table


def test_a_label_in_tokens_gives_the_size_and_its_unit(tmp_path):
    """Without embedding lookups, the first GEMM's rows size a micro-batch: tokens only when its input has a
    sequence axis ([1, T, H]); a label in tokens replaces a size of unknown unit."""
    rank = st.simulate(st.Job(framework="verl-fsdp", steps=((1024, 2048),), logprob=False))
    keep = [h for h in rank.host if h.name != "aten::embedding"]
    table = _found(replace(rank, host=keep), tmp_path).table
    assert set(table["tokens_from"]) == {"gemm"} and set(table["size_unit"]) == {"tokens"}
    flat = [
        replace(h, shapes=[s[1:] if len(s) == 3 else s for s in h.shapes]) if h.shapes else h for h in keep
    ]
    (tmp_path / "flat").mkdir()
    table = _found(replace(rank, host=flat), tmp_path / "flat").table
    assert set(table["size_unit"]) == {"unknown"} and sorted(table["num_tokens"]) == [1024, 2048]
    (tmp_path / "lab").mkdir()
    labelled = _found(replace(rank, host=flat), tmp_path / "lab", Labels(tokens_per_microbatch=4096)).table
    assert set(labelled["size_unit"]) == {"tokens"} and set(labelled["num_tokens"]) == {4096}


def _cut(rank: st.Rank, table: pd.DataFrame) -> None:
    """Every micro-batch of the truth found once, with its tokens and seconds."""
    m = _merged(rank, table)
    truth = {(t.phase, t.step, t.microbatch): t.tokens for t in rank.truth}
    assert all(r.num_tokens == truth[(r.phase, r.step, r.microbatch)] for r in m.itertuples())
    on_basis = m["device_s"].where(m["seconds_basis"] == "device", m["host_s"])
    assert ((m["seconds"] / on_basis - 1).abs() < 0.02).all()


def test_a_position_bias_lookup_in_every_layer_is_not_a_forward(tmp_path):
    """T5 / UMT5 look up a [32, heads] relative-position-bias table in every layer: not a token embedding."""
    steps = ((1024, (2, 512), 2048), (512, 1536))
    rank = st.simulate(st.Job(steps=steps, layers=4, position_bias=True))
    assert sum(h.name == "aten::embedding" for h in rank.host) == 5 * len(rank.truth)  # 1 token + 4 bias
    found = _found(rank, tmp_path)
    _cut(rank, found.table)
    assert set(found.table["tokens_from"]) == {"embedding"} and set(found.table["size_unit"]) == {"tokens"}


def test_a_model_call_through_two_towers_is_one_microbatch(tmp_path):
    """Each call looks up two tables (two towers) before its loss: one micro-batch, in update and logprob."""
    rank = st.simulate(st.Job(steps=((1024, 2048, 512),), towers=2))
    tables = {tuple(h.shapes[0]) for h in rank.host if h.name == "aten::embedding"}
    assert len(tables) == 2
    found = _found(rank, tmp_path)
    assert sorted(found.table["phase"].value_counts().items()) == [("logprob", 3), ("update", 3)]
    _cut(rank, found.table)


@pytest.mark.parametrize("kind", ["decode", "diffusion"])
def test_a_loop_of_forwards_without_a_backward_is_not_microbatches(tmp_path, kind):
    """Generation (prefill + one-token decode forwards) and a diffusion pipeline (text encoder, then a denoising
    loop): no backward, no logprob / reward range -- no micro-batches, even with every label given."""
    rank = st.simulate_inference(st.Job(steps=(((2, 256),),)), kind)
    assert not rank.truth
    labels = Labels(model="m", precision="bf16", tokens_per_microbatch=512, phase="logprob")
    for lab in (None, labels):
        (tmp_path / str(lab is None)).mkdir()
        found = _found(rank, tmp_path / str(lab is None), lab)
        assert len(found.table) == 0
        why = " ".join(p for n in found.notes for p in n["problems"])
        assert "no backward pass" in why and "not training micro-batches" in why
