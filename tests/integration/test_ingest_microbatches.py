"""Breakeven from anyone's trace, end to end: ``mxperf ingest`` (no labels) -> ``microbatches.parquet`` ->
``mxperf fit``, on simulated verl and NeMo RL traces with the truth built in (``tests/synthetic_traces.py``),
and on mxperf's own traced run."""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import synthetic_traces as st

from mxperf.cli import main
from tracing.outputs import schema, store
from tracing.outputs.manifest import read_manifest

SIZES = (256, 512, 768, 1024, 1536, 2048, 3072, 4096)


def _steps(seed: int, n_steps: int = 8, per_step: int = 4) -> tuple[tuple[int, ...], ...]:
    rng = random.Random(seed)
    return tuple(tuple(rng.choice(SIZES) for _ in range(per_step)) for _ in range(n_steps))


def _json_line(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_fit_over_one_bf16_and_one_mxfp8_ingest_recovers_the_built_in_breakeven(tmp_path, capsys):
    steps = _steps(5)
    outs = {}
    for k, prec in enumerate(("bf16", "mxfp8")):
        job = st.Job(framework="verl-fsdp", precision=prec, steps=steps, minibatches=2, seed=k)
        trace = st.write_kineto(st.simulate(job), tmp_path / f"{prec}" / "prof_rank-0.json.gz")
        outs[prec] = tmp_path / f"ing-{prec}"
        assert main(["ingest", str(trace), "-o", str(outs[prec]), "--json"]) == 0
        captured = capsys.readouterr()
        (entry,) = _json_line(captured.out)["traces"]
        assert entry["microbatches"] == 2 * 32 and set(entry["phases"]) == {"logprob", "update"}
        assert "pid 4242 update: 32 micro-batches (detected)" in captured.err
        (traced,) = read_manifest(outs[prec])["traces"]
        assert traced["precision_evidence"]["precision"] == prec  # read from the GEMM kernel names
        assert {n["phase"] for n in traced["microbatch_notes"]} == {"logprob", "update"}
        mb = store.read_table(outs[prec] / store.MICROBATCHES)
        assert list(mb.columns[: len(schema.MICROBATCH_COLUMNS)]) == list(schema.MICROBATCH_COLUMNS)
        assert mb["repeat"].nunique() == len(steps) and set(mb["rank"]) == {0}
    assert main(["fit", str(outs["bf16"]), str(outs["mxfp8"]), "-o", str(tmp_path / "fit"), "--json"]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "fit" / store.FITS).read_text())
    (update,) = [m for m in doc["models"] if m["phase"] == "update"]
    truth = st.breakeven_tokens(st.Job(precision="bf16"), st.Job(precision="mxfp8"))
    be = update["breakeven"]
    assert be["case"] == "faster_above"
    assert be["tokens"] == pytest.approx(truth, rel=0.03)
    lo, hi = be["ci"]
    assert lo <= truth <= hi


def test_nemo_rl_nsys_export_gives_exact_tokens_and_seconds(tmp_path, capsys):
    steps = ((2048, 1024, (4, 512)), (4096, 512, 512, 768))
    rank = st.simulate(st.Job(framework="nemo-rl", precision="mxfp8", steps=steps))
    path = st.write_nsys_sqlite([rank], tmp_path / "dtensor_policy_worker_v2_3:5_4242.sqlite")
    out = tmp_path / "ing"
    assert main(["ingest", str(path), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "update: 7 micro-batches (detected)" in err and "logprob: 7 micro-batches (detected)" in err
    mb = store.read_table(out / store.MICROBATCHES)
    truth = {(t.phase, t.step, t.microbatch): t for t in rank.truth}
    assert len(mb) == len(truth)
    for r in mb.itertuples(index=False):
        t = truth[(r.phase, r.step - 3, r.microbatch)]  # steps 3 and 4, as the export's name says
        assert r.num_tokens == t.tokens and r.precision == "mxfp8"
        truth_s = t.device_seconds if r.seconds_basis == "device" else t.seconds  # the basis it says
        assert abs(r.seconds / truth_s - 1) < 0.02 and abs(r.host_seconds / t.seconds - 1) < 0.02


def test_ambiguous_cuts_are_explained_and_no_table_is_written(tmp_path, capsys):
    rank = st.simulate(st.Job(steps=((1024, 2048, 512, 1024),), logprob=False, schedule="1f1b"))
    path = st.write_kineto(rank, tmp_path / "rank-0.json.gz")
    out = tmp_path / "ing"
    assert main(["ingest", str(path), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "update: 0 micro-batches" in err and "interleave" in err and "no micro-batches guessed" in err
    assert not (out / store.MICROBATCHES).exists()
    (traced,) = read_manifest(out)["traces"]
    assert traced["microbatches"] == 0 and "interleave" in traced["microbatch_notes"][0]["problems"][0]


def test_colocated_processes_share_their_device_only_when_asked(tmp_path, capsys):
    learner = st.simulate(st.Job(steps=((2048, 1024),), logprob=False, pid=100, device=0))
    sampler = st.simulate(
        st.Job(steps=((512,) * 6,), logprob=False, pid=200, device=0, start_ns=3_000_000, seed=3)
    )
    a = st.write_kineto(learner, tmp_path / "learner.json.gz")
    b = st.write_kineto(sampler, tmp_path / "sampler.json.gz")
    for flag, processes in (([], 1), (["--colocated"], 2)):
        out = tmp_path / f"ing{len(flag)}"
        assert main(["ingest", str(a), str(b), "-o", str(out), *flag]) == 0
        dev = store.read_table(out / store.DEVICES)
        assert (dev["device_processes"] == processes).all()
        if processes == 1:
            assert (dev["device_busy_ns"] == dev["busy_ns"]).all()
        else:
            assert (dev["device_busy_ns"] > dev["busy_ns"]).all()
            assert (dev["device_host_stall_ns"] <= dev["host_stall_ns"]).all()
    # streamed, the timelines stay on disk in the staging folder (pool workers pass them by file name) until
    # the union across files is taken: the same device table, and nothing left behind
    for extra in (["--stream", "on"], ["--stream", "on", "--workers", "2"]):
        out = tmp_path / f"ing-{len(extra)}"
        assert main(["ingest", str(a), str(b), "-o", str(out), "--colocated", *extra]) == 0
        streamed = store.read_table(out / store.DEVICES)
        pd.testing.assert_frame_equal(streamed, dev, check_exact=True)
        assert not (out / ".staging").exists()
    capsys.readouterr()


def _traced_run(run: Path) -> None:
    """mxperf's own capture path on a tiny torch model: RangeLog(encode_attrs=True) + Capture(record_shapes)."""
    torch = pytest.importorskip("torch")
    from tracing.capture.profiler import Capture, CaptureConfig
    from tracing.capture.ranges import RangeLog
    from tracing.outputs.manifest import OutputDir

    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(97, 32), torch.nn.Linear(32, 97)
    log = RangeLog(emit_nvtx=False, encode_attrs=True)
    with OutputDir(run, kind="run", config={"model": "tiny", "tokens_per_microbatch": 64}) as od:
        with Capture(od.path, CaptureConfig(wait=0, warmup=1, active=2, record_shapes=True), rank=0) as cap:
            for step in range(3):
                with log.range("update", step=step, precision="bf16"):
                    for i, n in enumerate((64, 48)):
                        ids = torch.randint(0, 97, (1, n))
                        with log.range(
                            "update/microbatch", step=step, microbatch=i, tokens=n, precision="bf16"
                        ):
                            head(emb(ids)).logsumexp(-1).mean().backward()
                cap.step()
        store.write_table(log.to_frame(), od.path / store.RANGES)


def _update_tables(tmp_path: Path, run: Path, trace: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The update micro-batches of a run ingested from its range log, and from its trace alone (no labels)."""
    tables = []
    for name, target in (("log", run), ("trace", trace)):
        assert main(["ingest", str(target), "-o", str(tmp_path / name)]) == 0
        mb = store.read_table(tmp_path / name / store.MICROBATCHES)
        tables.append(mb[mb["phase"] == "update"].sort_values(["step", "microbatch"], ignore_index=True))
    return tables[0], tables[1]


def test_own_traced_run_without_labels_gives_the_micro_batch_table_of_its_range_log(tmp_path, capsys):
    run = tmp_path / "run"
    _traced_run(run)
    trace = next((run / store.TRACE_DIR).glob("rank-*.json.gz"))
    keys = ["phase", "step", "microbatch", "num_tokens", "tokens_per_microbatch", "precision", "source"]
    log, traced = _update_tables(tmp_path, run, trace)
    capsys.readouterr()
    log = log[log["step"] >= 1].reset_index(drop=True)  # the profiler warms up on step 0
    assert len(log) == 4 and log[keys].equals(traced[keys])
    assert set(log["source"]) == {"range"} and log["num_tokens"].tolist() == [64, 48, 64, 48]
    assert (abs(traced["seconds"] - log["seconds"]) < 0.1 * log["seconds"] + 2e-3).all()  # two clocks


@pytest.mark.slow
def test_mxperf_run_trace_ingested_without_labels_matches_its_range_log(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["run", "--model", "tiny-dense", "--steps", "2", "--pretrain-steps", "0", "--threads", "1"]
    assert main([*args, "--trace", "-o", str(run)]) == 0
    trace = next((run / store.TRACE_DIR).glob("rank-*.json.gz"))
    keys = ["step", "microbatch", "num_tokens", "precision", "source"]
    log, traced = _update_tables(tmp_path, run, trace)
    capsys.readouterr()
    assert len(log) >= 2 and log[keys].equals(traced[keys])


def test_a_trace_without_launch_calls_measures_no_gpu_work_per_microbatch(tmp_path, capsys):
    """Kineto without its cuda_runtime events (no launch record): the GPU rows go to the file's one process, the
    device keeps its busy time, the micro-batches their host times, and what needs the launches -- the GPU work
    a micro-batch launched, the host stall inside it -- is null (not measured), never 0. With two processes in
    the file the GPU rows belong to neither, and a range's device busy time is not measured either."""
    import gzip

    job = st.Job(framework="verl-fsdp", precision="bf16", steps=_steps(5)[:2], minibatches=2, seed=0)
    full = st.write_kineto(st.simulate(job), tmp_path / "full" / "prof_rank-0.json.gz")
    doc = json.loads(gzip.decompress(full.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "cuda_runtime"]
    bare = tmp_path / "bare" / "prof_rank-0.json.gz"
    bare.parent.mkdir()
    bare.write_bytes(gzip.compress(json.dumps(doc).encode()))
    # and one more process (a CPU op of another pid): the GPU rows then belong to no process
    other = {**next(e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"), "pid": 777, "tid": 778}
    doc["traceEvents"].append(other)
    two = tmp_path / "two" / "prof_rank-0.json.gz"
    two.parent.mkdir()
    two.write_bytes(gzip.compress(json.dumps(doc).encode()))
    tables = {}
    for name, trace in (("full", full), ("bare", bare), ("two", two)):
        out = tmp_path / f"ingest-{name}"
        assert main(["ingest", str(trace), "-o", str(out), "--no-progress"]) == 0
        tables[name] = tuple(
            store.read_table(out / t) for t in (store.DEVICES, store.MICROBATCHES, store.RANGES)
        )
    err = capsys.readouterr().err
    assert "pid 4242 device 0:" in err.split(str(bare))[1] and "host stall unknown" in err
    (dev_full, mb_full, ranges_full), (dev_bare, mb_bare, ranges_bare) = tables["full"], tables["bare"]
    assert list(dev_bare["pid"]) == list(dev_full["pid"]) == [4242]
    assert list(dev_bare["busy_ns"]) == list(dev_full["busy_ns"])
    assert len(mb_bare) == len(mb_full) > 0
    assert mb_full["gpu_busy_seconds"].notna().all() and mb_full["host_stall_seconds"].notna().all()
    assert mb_bare["gpu_busy_seconds"].isna().all() and mb_bare["host_stall_seconds"].isna().all()
    assert (mb_bare["seconds"] > 0).all()
    # ranges: the device's busy time inside each is measured, what the range launched and the stall are not
    assert (ranges_full["gpu_reason"] == "").all() and ranges_full["host_stall_ns"].notna().all()
    assert ranges_bare["gpu_reason"].str.startswith("no launch call in the trace ties GPU work to this").all()
    for c in ("thread_ops", "window_busy_ns", "gpu_end_ns", "host_stall_ns"):
        assert ranges_bare[c].isna().all(), c
    assert (ranges_bare["busy_in_window_ns"] > 0).all()
    dev_two, mb_two, ranges_two = tables["two"]
    assert list(dev_two["pid"]) == [-1] and list(dev_two["busy_ns"]) == list(dev_full["busy_ns"])
    assert len(mb_two) == len(mb_full)
    assert mb_two["gpu_busy_seconds"].isna().all() and mb_two["host_stall_seconds"].isna().all()
    mine = ranges_two[ranges_two["pid"] == 4242]
    assert len(mine) and mine["busy_in_window_ns"].isna().all() and mine["host_stall_ns"].isna().all()


def test_microbatches_take_the_step_numbers_of_the_step_table(tmp_path, capsys):
    """A traced run whose profiler started late: ``ProfilerStep#0`` holds the framework's ``step[step=5]``. The
    step table numbers that step 5; the micro-batches found inside it must say 5 too (not the profiler's 0), or
    ``mxperf diff`` / ``kernels`` / the step model would join them to no step."""
    import gzip

    job = st.Job(framework="verl-fsdp", precision="bf16", steps=_steps(5)[:2], minibatches=2, seed=0)
    trace = st.write_kineto(st.simulate(job), tmp_path / "full" / "prof_rank-0.json.gz")
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    profiler = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(profiler) == 2
    for e in (
        profiler
    ):  # the run's own step range inside it, numbered by the run (encoded as the range helper does)
        k = int(e["name"].split("#")[1])
        doc["traceEvents"].append(
            {**e, "name": f"step[step={k + 5}]", "ts": e["ts"] + 1, "dur": e["dur"] - 2}
        )
    late = tmp_path / "late" / "prof_rank-0.json.gz"
    late.parent.mkdir()
    late.write_bytes(gzip.compress(json.dumps(doc).encode()))
    out = tmp_path / "ing"
    assert main(["ingest", str(late), "-o", str(out)]) == 0
    capsys.readouterr()
    step_table = set(store.read_table(out / store.STEPS)["step"])
    mbs = store.read_table(out / store.MICROBATCHES)
    assert step_table == {5, 6} and len(mbs) > 0
    assert set(mbs["step"]) == step_table


def test_a_file_per_profiled_step_without_step_ranges_gives_one_step_each_numbered_on(tmp_path, capsys):
    """verl's torch profiler: a file per (worker, profiled step), no ProfilerStep#N, stage ranges only; the
    steps are inferred from the phase ranges and numbered on across a rank's files in time order (files
    named as verl names them: the later step's file comes first by name here, so name order would be wrong)."""
    folder = tmp_path / "e2e"
    for r in range(2):
        for k, (stamp, later) in enumerate((("20261208010301001", 1), ("20261208010101001", 0))):
            job = st.Job(
                steps=(((512, 1024) if later == 0 else (2048,)),),
                minibatches=2,
                rank=r,
                seed=r + 2 * k,
                profiler_steps=False,
                base_time_ns=1_700_000_000_000_000_000 + later * 10**10,
            )
            name = f"actor_e2e_rank{r}-of-2_pid4242_{'9' if later == 0 else '1'}{stamp}.json.gz"
            st.write_kineto(st.simulate(job), folder / name, world_size=2)
            if r == 0:  # rank 0's critic worker: another process, a file per step of its own
                critic = replace(job, pid=5151, steps=((256,),), seed=7 + k)
                st.write_kineto(st.simulate(critic), folder / name.replace("actor", "critic"), world_size=2)
    out = tmp_path / "ing"
    assert main(["ingest", str(folder), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "rank 0 (pid 4242): 2 files number their steps alike" in err and "numbered on in time order" in err
    assert "rank 0 (pid 5151): 2 files number their steps alike" in err
    said = [w for t in read_manifest(out)["traces"] for w in t["step_notes"]]
    assert sum(w.startswith("steps 0-0 numbered 1-1: file 2 of 2 of rank") for w in said) == 3
    assert "no step range: 1 step(s) inferred from its phase ranges" in err
    steps = store.read_table(out / store.STEPS)
    per_step = steps.groupby(["rank", "step"])["seconds"].sum()
    assert list(per_step.index) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    mb = store.read_table(out / store.MICROBATCHES)
    tokens = (
        mb[mb["phase"] == "update"].groupby(["rank", "pid", "step"])["num_tokens"].apply(sorted).to_dict()
    )
    assert tokens == {
        (0, 4242, 0): [512, 1024],
        (0, 4242, 1): [2048],
        (0, 5151, 0): [256],
        (0, 5151, 1): [256],
        (1, 4242, 0): [512, 1024],
        (1, 4242, 1): [2048],
    }
    assert steps.groupby(["pid", "step"])["trace"].nunique().to_dict() == {
        (4242, 0): 2,
        (4242, 1): 2,
        (5151, 0): 1,
        (5151, 1): 1,
    }
    stragglers = store.read_table(out / store.STRAGGLERS)
    assert stragglers["step"].tolist() == [0, 1] and stragglers["processes"].tolist() == [3, 3]
    # the step model reads these steps and says they span their phases only
    from perfmodel.inputs.ingest_steps import phase_sources

    sources, notes = phase_sources(out, read_manifest(out))
    assert sources and [n for n in notes if "inferred" in n] == [
        f"{out}: the steps of 6 of its traces are inferred from phase ranges (no step range in the trace): each "
        "spans its phases only, so time between them (a worker waiting for the driver's reward, say) is in no "
        "phase; a metric log's step timer (verl timing_s/step) gives the whole step"
    ]


def test_files_of_one_process_without_a_rank_number_their_steps_on(tmp_path, capsys):
    """nsys captures of one verl worker (``worker_process_<pid>.<k>``) carry no rank: grouped by process."""
    for k in range(2):
        job = st.Job(steps=((512, 1024),), minibatches=2, seed=k, profiler_steps=False)
        path = st.write_kineto(st.simulate(job), tmp_path / "in" / f"worker_process_4242.{k + 1}.json.gz")
        doc = json.loads(gzip.decompress(path.read_bytes()))
        doc.pop("distributedInfo", None)
        doc["baseTimeNanoseconds"] += k * 10**10  # the later capture
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert main(["ingest", str(tmp_path / "in"), "-o", str(tmp_path / "ing")]) == 0
    assert "pid 4242: 2 files number their steps alike" in capsys.readouterr().err
    steps = store.read_table(tmp_path / "ing" / store.STEPS)
    assert steps.groupby("trace")["step"].unique().map(list).tolist() == [[0], [1]]


def test_a_nemo_rl_export_takes_the_step_numbers_its_name_gives(tmp_path, capsys):
    """NeMo RL names its nsys export by the steps it profiled (``<worker>_<start>:<stop>_<pid>``); its steps,
    inferred from the phase cycles (no step range), are those steps, its micro-batches with them."""
    job = st.Job(framework="nemo-rl", steps=((512, 1024), (2048,)), seed=3)
    path = st.write_nsys_sqlite([st.simulate(job)], tmp_path / "dtensor_policy_worker_v2_3:5_4242.sqlite")
    assert main(["ingest", str(path), "-o", str(tmp_path / "ing")]) == 0
    assert "2 step(s) inferred from its phase ranges" in capsys.readouterr().err
    assert sorted(set(store.read_table(tmp_path / "ing" / store.STEPS)["step"])) == [3, 4]
    mb = store.read_table(tmp_path / "ing" / store.MICROBATCHES)
    assert mb.groupby("step")["num_tokens"].apply(sorted).to_dict() == {
        3: [512, 512, 1024, 1024],
        4: [2048, 2048],
    }


def test_verl_files_named_by_step_take_that_step_even_a_stage_alone(tmp_path, capsys):
    """verl's torch profiler names each file by the RL step it holds (``<worker>_<stage>_step<N>_rank<r>-of-<w>_
    ..._pid<p>_<time>``); in its discrete mode a file holds one stage (here the update alone, no other phase to
    infer a cycle from). Each such file is that step, numbered as its name says, micro-batches with it."""
    folder = tmp_path / "discrete"
    truth = {}
    for k, (step, sizes) in enumerate(((7, (512, 1024)), (9, (2048,)), (11, (768,)))):
        job = st.Job(
            steps=(sizes,),
            logprob=False,
            profiler_steps=False,
            seed=k,
            base_time_ns=1_700_000_000 * 10**9 + k * 10**10,
        )
        sim = st.simulate(job)
        truth[step] = sorted(r.tokens for r in sim.truth if r.phase == "update")
        window = "_mb0-1" if step == 11 else ""  # a schedule's window of the update: a part of its step
        name = f"actor_actor_update_step{step}_rank0-of-1_pid4242_2026120801010{k}001{window}.json.gz"
        st.write_kineto(sim, folder / name, world_size=1)
    whole = st.Job(
        steps=((256, 768),), profiler_steps=False, seed=5, pid=4343, base_time_ns=1_700_000_100 * 10**9
    )
    st.write_kineto(
        st.simulate(whole), folder / "actor_train_step12_rank0-of-1_pid4343_20261208010501001.json.gz"
    )
    out = tmp_path / "ing"
    assert main(["ingest", str(folder), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("its phase ranges are the one step its file name gives") == 4
    assert err.count("the file holds update mini-batches 0-1 of it only") == 1
    steps = store.read_table(out / store.STEPS)
    assert steps.groupby("pid")["step"].unique().map(sorted).to_dict() == {4242: [7, 9, 11], 4343: [12]}
    seen = steps[(steps["pid"] == 4242) & (steps["seconds"] > 0)]
    assert set(seen["phase"]) == {"update"}
    mb = store.read_table(out / store.MICROBATCHES)
    mine = mb[(mb["pid"] == 4242) & (mb["phase"] == "update")]
    assert (
        mine.groupby("step")["num_tokens"].apply(sorted).to_dict() == truth
    )  # whole micro-batches: all kept
    from perfmodel.inputs.ingest_steps import phase_sources

    sources, notes = phase_sources(out, read_manifest(out))  # the window's step is left out of step times
    assert any("1 of its traces hold a window of their step only" in n for n in notes)
    assert sources and all(11 not in set(src.steps["step"]) for src in sources)
    assert any({7, 9} <= set(src.steps["step"]) for src in sources)


@pytest.mark.parametrize("apart_s", [0, 10])
def test_roles_that_run_one_step_at_the_same_time_are_said_to_overlap(tmp_path, capsys, apart_s):
    """An async trainer: one process scores and updates while a sampler (another role: its one phase is named
    as a generation here) runs the same steps at the same time. Adding the roles' phases over-states a step: the
    ingest and the step model say so; processes that take turns (10 s apart) are not flagged."""
    folder = tmp_path / "async"
    for pid, logprob, later in ((4242, True, 0), (5151, False, apart_s)):
        job = st.Job(
            steps=((512, 1024), (2048,)),
            logprob=logprob,
            pid=pid,
            profiler_steps=not logprob,  # the sampler: steps from its ProfilerStep#N
            seed=pid,
            base_time_ns=1_700_000_000 * 10**9 + later * 10**9,
        )
        path = st.write_kineto(st.simulate(job), folder / f"worker_{pid}.json.gz")
        if not logprob:  # its phase range named as verl names a generation
            path.write_bytes(
                gzip.compress(
                    gzip.decompress(path.read_bytes()).replace(b"update_actor", b"generate_sequences")
                )
            )
    out = tmp_path / "ing"
    assert main(["ingest", str(folder), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    said = [n for t in read_manifest(out)["traces"] for n in t["step_notes"] if "runs at the same time" in n]
    from perfmodel.inputs.ingest_steps import phase_sources

    _, notes = phase_sources(out, read_manifest(out))
    flagged = [n for n in notes if "async trainer" in n]
    if apart_s:
        assert not said and "async trainer" not in err and not flagged
    else:
        assert len(said) == 2 and all(n.startswith("steps 0, 1: runs at the same time") for n in said)
        assert "run the same steps at the same time in 2 file(s): an async trainer" in err
        assert len(flagged) == 1


@pytest.mark.parametrize(
    ("name", "numbers"), [("vllm_worker_3:5_4242", [3, 4]), ("vllm_worker_3:6_4242", [])]
)
def test_a_one_phase_export_is_a_range_a_step_only_when_its_name_counts_as_many(tmp_path, name, numbers):
    """A NeMo RL worker that runs one phase (a sampler: one generate call a step) has no phase cycle to infer
    steps from; its export's name gives the steps it holds, and when that is as many as its ranges, each range is
    one of them. A count that disagrees gives no steps rather than a guess."""
    job = st.Job(framework="nemo-rl", steps=((512,), (1024,)), logprob=False, seed=3)
    path = st.write_nsys_sqlite([st.simulate(job)], tmp_path / f"{name}.sqlite")
    assert main(["ingest", str(path), "-o", str(tmp_path / "ing")]) == 0
    steps = store.read_table(tmp_path / "ing" / store.STEPS)
    assert sorted(set(steps["step"])) == numbers


def test_a_verl_file_of_consecutive_steps_numbers_them_from_the_one_its_name_gives(tmp_path, capsys):
    """verl's ``global_profiler.profile_continuous_steps`` starts one file at the first of consecutive profiled
    steps and names it by that step: its phase cycles are steps N, N + 1, ..., not one step."""
    job = st.Job(steps=((512,), (1024,), (768,)), profiler_steps=False, seed=4)
    st.write_kineto(
        st.simulate(job), tmp_path / "in" / "actor_e2e_step20_rank0-of-1_pid4242_20261208010101001.json.gz"
    )
    assert main(["ingest", str(tmp_path / "in"), "-o", str(tmp_path / "ing")]) == 0
    assert "3 step(s) inferred from its phase ranges" in capsys.readouterr().err
    assert sorted(set(store.read_table(tmp_path / "ing" / store.STEPS)["step"])) == [20, 21, 22]
    mb = store.read_table(tmp_path / "ing" / store.MICROBATCHES)
    assert mb[mb["phase"] == "update"].set_index("step")["num_tokens"].to_dict() == {
        20: 512,
        21: 1024,
        22: 768,
    }
