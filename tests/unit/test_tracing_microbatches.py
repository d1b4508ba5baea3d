"""Micro-batches found in traces without labels (tracing.analysis.mbdetect / microbatches), against truth.

The traces are simulated (``tests/synthetic_traces.py``) in the shape verl's FSDP and Megatron actors and
NeMo RL's DTensor worker leave: embedding + linear ops with shapes, backward on the autograd thread, async
GPU work, a sync per micro-batch, an optimizer step, steps with different size mixes. Each knows every
micro-batch's tokens and its seconds on the SPEC v2 time basis.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import synthetic_traces as st

from tracing.analysis import attribution, metrics
from tracing.analysis.microbatches import find_microbatches
from tracing.analysis.precision import PrecisionEvidence, reconcile
from tracing.ingest.detect import load_trace
from tracing.outputs import schema
from tracing.outputs.labels import Labels

STEPS = ((2048, 1024, (4, 512)), (4096, 512, 512, 768), (256, 3072, 1536))
KINETO = {"verl-fsdp": ".json.gz", "verl-megatron": ".json.gz", "nemo-rl": ".sqlite"}


def _write(rank: st.Rank, path: Path, **kw) -> Path:
    if path.suffix == ".sqlite":
        return st.write_nsys_sqlite([rank], path, **kw)
    return st.write_kineto(rank, path, **kw)


def _found(path: Path, labels: Labels | None = None, pattern: str | None = None):
    trace = load_trace(path)
    ops = metrics.gpu_ops(trace.events)
    return find_microbatches(
        trace, attribution.attribute_ranges(trace, ops=ops), labels, pattern=pattern, ops=ops
    )


def _truth(rank: st.Rank) -> pd.DataFrame:
    rows = [
        {**vars(t), "host_s": t.seconds, "device_s": t.device_seconds, "busy_s": t.gpu_busy_seconds}
        for t in rank.truth
    ]
    return pd.DataFrame(rows)[["phase", "step", "microbatch", "tokens", "host_s", "device_s", "busy_s"]]


def _err(merged: pd.DataFrame) -> pd.Series:
    """Relative error of ``seconds`` against the truth on the basis the table says it uses."""
    truth = merged["device_s"].where(merged["seconds_basis"] == "device", merged["host_s"])
    return (merged["seconds"] / truth - 1).abs()


@pytest.fixture(scope="module", params=sorted(KINETO))
def case(request, tmp_path_factory):
    fw = request.param
    job = st.Job(
        framework=fw, precision="mxfp8" if fw == "verl-megatron" else "bf16", steps=STEPS, minibatches=2
    )
    rank = st.simulate(job)
    path = _write(rank, tmp_path_factory.mktemp(fw) / f"rank-0{KINETO[fw]}")
    return job, rank, _found(path)


def test_every_microbatch_is_found_with_exact_tokens_and_seconds_within_2_percent(case):
    job, rank, found = case
    mb = found.table
    assert list(mb.columns[: len(schema.MICROBATCH_COLUMNS)]) == list(schema.MICROBATCH_COLUMNS)
    merged = mb.merge(_truth(rank), on=["phase", "step", "microbatch"], how="outer", indicator=True)
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"]
    assert len(mb) == 2 * sum(len(s) for s in STEPS)  # logprob + update, every step
    assert (merged["num_tokens"] == merged["tokens"]).all()  # packed [1, T] and padded [4, 512] alike
    assert (merged["tokens_per_microbatch"] == merged["tokens"]).all()
    err = _err(merged)
    assert err.max() < 0.02, merged.loc[err.idxmax()]
    assert ((merged["host_seconds"] / merged["host_s"] - 1).abs() < 0.02).all()  # the host window beside it
    assert ((merged["gpu_busy_seconds"] / merged["busy_s"] - 1).abs() < 0.02).all()  # its own GPU ops only
    assert set(mb["source"]) == {"detected"} and set(mb["tokens_from"]) == {"embedding"}
    assert set(mb["precision"]) == {job.precision}  # from the GEMM kernel names
    assert set(mb["model"]) == {f"unlabelled-v{job.vocab}-h{job.hidden}"}  # the embedding table's shape
    assert (mb["gpu_busy_seconds"] <= mb["host_seconds"] + 1e-9).all()
    assert mb["repeat"].nunique() == len(STEPS)  # one traced step of one rank
    assert found.notes and all(n["microbatches"] for n in found.notes)


def test_synced_update_microbatches_do_not_overlap_but_async_logprob_ones_do(case):
    job, _, found = case
    mb = found.table
    update = mb[mb["phase"] == "update"]
    if job.framework != "nemo-rl":  # NeMo RL syncs before the backward, not after it
        assert (update["overlap_seconds"] < 0.05 * update["seconds"]).all()
        assert set(update["seconds_basis"]) == {"host"}  # synced: the host window is the cost
    assert set(mb[mb["phase"] == "logprob"]["seconds_basis"]) == {"device"}  # the host runs ahead
    logprob_note = next(n for n in found.notes if n["phase"] == "logprob")
    assert any("behind the host" in p and "seconds_basis = device" in p for p in logprob_note["problems"])


def test_megatron_tokens_come_from_the_embedding_lookup_without_any_gemm_op():
    rank = st.simulate(st.Job(framework="verl-megatron", steps=((1024, (2, 1024)),), logprob=False))
    names = {h.name for h in rank.host if h.kind == "cpu_op"}
    assert "aten::linear" in names  # only the LM head: Transformer Engine linears leave no op
    assert sum(h.name == "aten::linear" for h in rank.host) == 2


def test_without_embedding_ops_tokens_come_from_the_first_gemm_and_cuts_from_backwards(tmp_path):
    rank = st.simulate(st.Job(steps=STEPS, logprob=False))
    rank.host = [h for h in rank.host if h.name != "aten::embedding"]  # e.g. an embedding outside torch
    found = _found(st.write_kineto(rank, tmp_path / "rank-0.json.gz"))
    mb = found.table.merge(_truth(rank), on=["phase", "step", "microbatch"])
    assert len(mb) == len(rank.truth)
    assert (mb["num_tokens"] == mb["tokens"]).all() and set(mb["tokens_from"]) == {"gemm"}
    assert (_err(mb) < 0.02).all()


def test_a_trace_without_shapes_says_so_and_invents_nothing(tmp_path):
    rank = st.simulate(st.Job(steps=STEPS))
    path = st.write_kineto(rank, tmp_path / "rank-0.json.gz", shapes=False)
    found = _found(path)
    assert len(found.table) == 0
    update = next(n for n in found.notes if n["phase"] == "update")
    assert update["dropped"] == {"sizes could not be read": len(rank.truth) // 2}
    assert any("record_shapes=True" in p and "--label tokens_per_microbatch" in p for p in update["problems"])
    labelled = _found(path, Labels(tokens_per_microbatch=2048)).table
    assert len(labelled) == len(rank.truth)
    assert set(labelled["tokens_per_microbatch"]) == {2048} and set(labelled["num_tokens"]) == {2048}
    assert set(labelled["tokens_from"]) == {"label"} and set(labelled["model"]) == {"unlabelled"}


def test_label_budget_is_kept_and_read_tokens_are_what_was_processed(tmp_path):
    rank = st.simulate(st.Job(steps=STEPS, logprob=False))
    mb = _found(st.write_kineto(rank, tmp_path / "rank-0.json.gz"), Labels(tokens_per_microbatch=4096)).table
    assert set(mb["tokens_per_microbatch"]) == {4096}
    assert sorted(mb["num_tokens"]) == sorted(t.tokens for t in rank.truth)


def test_a_pipeline_parallel_schedule_is_ambiguous_and_gives_no_guessed_table(tmp_path):
    rank = st.simulate(st.Job(steps=((1024, 2048, 512, 1024),), logprob=False, schedule="1f1b"))
    found = _found(st.write_kineto(rank, tmp_path / "rank-0.json.gz"))
    assert len(found.table) == 0
    (note,) = found.notes
    assert note["phase"] == "update" and note["microbatches"] == 0
    assert "interleave" in note["problems"][0] and "no micro-batches guessed" in note["problems"][0]
    assert "update_actor @ " in note["problems"][0]  # which range, where


def test_nsys_without_emit_nvtx_cuts_backward_passes_and_asks_for_sizes(tmp_path):
    rank = st.simulate(st.Job(framework="nemo-rl", steps=STEPS))
    path = st.write_nsys_sqlite(
        [rank], tmp_path / "dtensor_policy_worker_v2_3:6_4242.sqlite", emit_nvtx=False
    )
    found = _found(path)
    notes = {n["phase"]: n for n in found.notes}
    n_update = sum(len(s) for s in STEPS)
    assert notes["update"]["dropped"] == {"sizes could not be read": n_update}  # found, but no sizes
    assert "cannot be told apart" in " ".join(notes["logprob"]["problems"])  # forward-only, no signal
    labelled = _found(path, Labels(tokens_per_microbatch=1024)).table
    truth = _truth(rank)
    merged = labelled.merge(truth, on=["phase", "step", "microbatch"])
    assert len(merged) == n_update and set(merged["phase"]) == {"update"}
    assert (_err(merged) < 0.02).all()


@pytest.mark.parametrize("style", ["verl", "mxperf"])
def test_explicit_microbatch_ranges_are_used_as_they_are(tmp_path, style):
    rank = st.simulate(st.Job(steps=STEPS, explicit_ranges=style))
    mb = _found(st.write_kineto(rank, tmp_path / "rank-0.json.gz")).table
    truth = _truth(rank)
    merged = mb.merge(truth, on=["phase", "step", "microbatch"])
    assert len(merged) == len(truth)
    update = merged[merged["phase"] == "update"]
    assert set(update["source"]) == {"range"}
    assert (merged["num_tokens"] == merged["tokens"]).all()
    assert set(update["tokens_from"]) == ({"attrs"} if style == "mxperf" else {"embedding"})
    assert (_err(merged) < 0.02).all()


def test_an_explicit_range_holding_several_forwards_is_split(tmp_path):
    rank = st.simulate(st.Job(steps=((1024, 2048, 512),), logprob=False))
    first = next(h for h in rank.host if h.name == "update_actor")
    chunk = st.Host(
        "range", "megatron_policy_worker/train_microbatch", first.tid, first.start + 1, first.end - 1
    )
    rank.host.append(chunk)  # NeMo RL's train_microbatch: one forward_backward_func call over a chunk
    mb = _found(st.write_kineto(rank, tmp_path / "rank-0.json.gz")).table
    assert sorted(mb["num_tokens"]) == [512, 1024, 2048] and set(mb["source"]) == {"detected"}


def test_a_pattern_matching_nothing_says_so(tmp_path):
    rank = st.simulate(st.Job(steps=((1024,),)))
    found = _found(st.write_kineto(rank, tmp_path / "rank-0.json.gz"), pattern="no_such_range")
    assert len(found.table) == 0
    assert "no range matches --microbatch-range 'no_such_range'" in " ".join(found.lines("t"))


def test_precision_label_wins_and_a_disagreement_names_both(tmp_path):
    rank = st.simulate(st.Job(precision="mxfp8", steps=((1024, 2048),), logprob=False))
    found = _found(st.write_kineto(rank, tmp_path / "rank-0.json.gz"), Labels(precision="bf16"))
    assert set(found.table["precision"]) == {"bf16"}
    (warning,) = found.warnings
    assert "label precision=bf16" in warning and "look mxfp8" in warning and "UE8M0" in warning
    assert found.precision.precision == "mxfp8" and found.precision.share > 0.5


@pytest.mark.parametrize(
    ("label", "family", "warns"),
    [
        ("mxfp8", "mxfp8", False),
        ("fp8-delayed", "fp8", False),
        ("bf16", "fp8", True),
        ("fp8-tensor", "bf16", True),
    ],
)
def test_reconcile_label_with_kernel_family(label, family, warns):
    ev = PrecisionEvidence(None if family == "fp8" else family, family, 1, 1.0, "k", "r")
    precision, warning = reconcile(label, ev)
    assert precision == label and bool(warning) == warns


def test_colocated_processes_on_one_gpu_see_each_others_kernels(tmp_path):
    learner = st.simulate(st.Job(steps=((2048, 1024),), logprob=False, pid=100, device=0))
    sampler = st.simulate(
        st.Job(steps=((512,) * 6,), logprob=False, pid=200, device=0, start_ns=3_000_000, seed=3)
    )
    path = st.write_nsys_sqlite([learner, sampler], tmp_path / "colocated.sqlite")
    trace = load_trace(path)
    ops = metrics.gpu_ops(trace.events)
    dev = metrics.device_metrics(trace.events).set_index("pid")
    union = metrics.measure(ops["start_ns"].to_numpy(), ops["end_ns"].to_numpy())
    assert (dev["device_processes"] == 2).all()
    for pid, row in dev.iterrows():
        mine = ops[ops["pid"] == pid]
        assert row.busy_ns == metrics.measure(mine["start_ns"].to_numpy(), mine["end_ns"].to_numpy())
        assert row.busy_ns < row.device_busy_ns <= min(row.span_ns, union)
        assert row.device_idle_ns == row.span_ns - row.device_busy_ns
        assert 0 <= row.device_host_stall_ns <= row.host_stall_ns
    # alone on its device, a process's device view is its own
    alone = metrics.device_metrics(
        load_trace(st.write_nsys_sqlite([learner], tmp_path / "alone.sqlite")).events
    )
    assert (alone["device_busy_ns"] == alone["busy_ns"]).all() and (alone["device_processes"] == 1).all()


def test_input_dims_reach_the_shapes_column(tmp_path):
    """Input Dims travel through the Kineto decoder to the shapes column, canonicalized."""
    from tracing.ingest import kineto

    rank = st.simulate(replace(st.Job(steps=((1024, (2, 256)),))))
    path = st.write_kineto(rank, tmp_path / "rank-0.json.gz")
    events = kineto.load_kineto_events(path).events
    emb = events[events["name"] == "aten::embedding"]
    assert set(emb["shapes"].astype(str)) == {
        "[[32000,1024],[1,1024],[],[],[]]",
        "[[32000,1024],[2,256],[],[],[]]",
    }


def test_explicit_range_attributes_that_are_not_counts_are_ignored_not_trusted(tmp_path):
    rank = st.simulate(st.Job(steps=((1024, 2048),), logprob=False, explicit_ranges="mxperf"))
    for h in rank.host:
        if h.name.startswith("update/microbatch["):
            h.name = "update/microbatch[step=x,microbatch=-1,tokens=inf,precision=fp7]"
    mb = _found(st.write_kineto(rank, tmp_path / "rank-0.json.gz")).table
    assert mb["num_tokens"].tolist() == [1024, 2048] and set(mb["tokens_from"]) == {"embedding"}
    assert mb["step"].tolist() == [0, 0] and mb["microbatch"].tolist() == [0, 1]  # ProfilerStep#0, order
    assert set(mb["precision"]) == {"bf16"} and set(mb["source"]) == {"range"}  # from the kernels


def test_notebook_facade_gives_the_detected_table_of_a_trace_file(tmp_path):
    import tracing

    rank = st.simulate(st.Job(steps=((1024, (2, 512)),)))
    path = st.write_kineto(rank, tmp_path / "rank-0.json.gz")
    got = tracing.open(path, labels=Labels(model="qwen")).microbatches()
    assert (
        len(got) == len(rank.truth) and set(got["model"]) == {"qwen"} and set(got["source"]) == {"detected"}
    )
    pd.testing.assert_frame_equal(got, _found(path, Labels(model="qwen")).table)


def test_a_real_torch_cpu_trace_is_cut_at_its_embedding_lookups_before_the_optimizer(tmp_path):
    """Real torch.profiler output (record_shapes): on CPU the backward runs on the calling thread."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(97, 32), torch.nn.Linear(32, 97)
    opt = torch.optim.AdamW([*emb.parameters(), *head.parameters()])
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        for _ in range(2):
            with torch.profiler.record_function("update_actor"):
                for n in (64, 48, 80):
                    loss = head(emb(torch.randint(0, 97, (2, n)))).logsumexp(-1).mean()
                    loss.backward()
                    loss.item()
                opt.step()
                opt.zero_grad()
            prof.step()
    path = tmp_path / "rank-0.json"
    prof.export_chrome_trace(str(path))
    found = _found(path, Labels(precision="bf16"))  # no GPU kernels to read a precision from
    mb = found.table
    assert mb["num_tokens"].tolist() == [128, 96, 160] * 2 and set(mb["phase"]) == {"update"}
    trace = load_trace(path)
    ranges = attribution.attribute_ranges(trace)
    opt_ranges = ranges[ranges["name"].str.startswith("Optimizer.step#")]
    for r in mb.itertuples(index=False):  # no micro-batch reaches into an optimizer step
        assert not ((opt_ranges["start_ns"] < r.end_ns) & (opt_ranges["end_ns"] > r.start_ns)).any()
    assert mb["gpu_busy_seconds"].isna().all()  # a CPU trace: GPU columns null, never a CPU stand-in
