"""Small output directories for the dashboard tests, written through the real writers.

``make_runs_dir(root)`` builds a RUNS_DIR with what every page reads: a BF16 and an MXFP8 run of one model
(metrics, range log, sync checks, fixed-weight eval), a CPU sweep of both precisions, a fit, an ingested GPU
trace (events, devices, ranges) and a fault matrix. ``add_broken_outputs(root)`` adds a half-written run
(``status: running``), runs with a corrupt metrics table (one of them newest and end-to-end MXFP8, so that it
would be the automatic pair), a manifest that is not JSON, a failed run and a fit whose sweep's manifest is
broken. ``add_symlinked_outputs(root, outside)`` adds links that leave RUNS_DIR: a manifest, a run's
sync-check table, an events table and a whole folder.
Numbers are deterministic and shaped like real ones (MXFP8 saves update time, adds sync time); they exercise
the dashboard, they are not measurements. The shipped real outputs live in ``examples/runs``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from tracing.outputs import schema, store
from tracing.outputs.manifest import OutputDir

MODEL = "tiny-dense"
STEPS = 6


def _run(root: Path, name: str, learner: str, sampler: str, *, fail_step: int | None = None) -> Path:
    rng = np.random.default_rng(0 if learner == "bf16" else 1)
    speed = {"bf16": 1.0, "mxfp8": 0.8}[learner]
    with OutputDir(
        root / name,
        kind="run",
        config={"model": MODEL, "learner": learner, "sampler": sampler, "steps": STEPS},
    ) as od:
        steps = np.arange(STEPS)
        gen = 0.50 * speed + 0.01 * rng.random(STEPS)
        logprob = 0.20 * speed + 0.01 * rng.random(STEPS)
        update = 0.90 * speed + 0.02 * rng.random(STEPS)
        sync = (0.05 if learner == "bf16" else 0.09) + 0.005 * rng.random(STEPS)
        step_s = gen + logprob + update + sync + 0.03
        kl = (2e-3 if learner != sampler else 4e-4) * (1 + 0.1 * rng.random(STEPS))
        metrics = pd.DataFrame(
            {
                "step": steps,
                "step_s": step_s,
                "generate_s": gen,
                "logprob_s": logprob,
                "update_s": update,
                "sync_s": sync,
                "sync_check_s": 0.6 * sync,  # the weight-sync checks run inside the timed sync
                "update_microbatch_s": 0.9 * update,
                "update_tokens": np.full(STEPS, 4096),
                "num_microbatches": np.full(STEPS, 4),
                "reward": 0.1 + 0.02 * steps,
                "kl_k1": kl,
                "kl_k3": kl * 0.9,
                "token_mult_prob_error": 1 + 3 * kl,
                "prob_abs_diff_mean": kl / 2,
                "prob_abs_diff_max": kl * 20,
            }
        )
        store.write_table(metrics, od.path / store.METRICS)
        store.write_table(_range_log(metrics), od.path / store.RANGES)
        rows = []
        for s in steps:
            for i in range(1, 8):
                failed = fail_step is not None and s >= fail_step and i == 1
                rows.append(
                    {
                        "step": int(s),
                        "invariant": f"I{i}",
                        "passed": not failed,
                        "first_failing_tensor": "model.layers.0.self_attn.qkv_proj.weight_scale"
                        if failed
                        else "",
                        "detail": "3 scale bytes differ" if failed else "",
                        "check_seconds": 0.002,
                    }
                )
        store.write_table(pd.DataFrame(rows), od.path / store.SYNC_CHECKS)
        store.write_table(
            pd.DataFrame(
                {
                    "learner": [learner] * 2,
                    "sampler": ["bf16", "mxfp8"],
                    "kl_k1": [1e-3, 4e-4],
                    "kl_k3": [9e-4, 3e-4],
                    "token_mult_prob_error": [1.003, 1.001],
                }
            ),
            od.path / store.EVAL_FIXED_WEIGHTS,
        )
        od.update(steps=STEPS)
    return od.path


def _range_log(metrics: pd.DataFrame) -> pd.DataFrame:
    rows, rid, t = [], 0, 1_000_000_000
    for r in metrics.itertuples():
        step_id = rid
        rows.append([rid, "step", t, t + int(r.step_s * 1e9), 1, 0, -1, json.dumps({"step": int(r.step)})])
        rid += 1
        cur = t
        for phase in ("generate", "logprob", "update", "sync"):
            dur = int(getattr(r, f"{phase}_s") * 1e9)
            rows.append([rid, phase, cur, cur + dur, 1, 1, step_id, json.dumps({"step": int(r.step)})])
            rid += 1
            cur += dur
        t += int(r.step_s * 1e9) + 1000
    df = pd.DataFrame(
        rows, columns=["range_id", "name", "start_ns", "end_ns", "tid", "depth", "parent_id", "attrs"]
    )
    df.insert(4, "dur_ns", df["end_ns"] - df["start_ns"])
    return df


def _sweep(root: Path, name: str = "sweep-tiny-dense") -> Path:
    rng = np.random.default_rng(2)
    rows = []
    for prec, fixed, per_tok in (("bf16", 0.010, 40e-6), ("mxfp8", 0.030, 30e-6)):
        for n in (256, 512, 1024, 2048, 4096):  # one fixed global batch of 4096 tokens re-split
            for rep in range(3):
                for mb in range(4096 // n):
                    rows.append(
                        {
                            "model": MODEL,
                            "precision": prec,
                            "phase": "update",
                            "tokens_per_microbatch": n,
                            "num_tokens": n,
                            "repeat": rep,
                            "step": rep,
                            "microbatch": mb,
                            "seconds": (fixed + per_tok * n) * (1 + 0.02 * rng.standard_normal()),
                            "gpu_busy_seconds": None,
                            "host_stall_seconds": None,
                            "peak_mem_bytes": None,
                            "flops": None,
                            "source": "sweep",
                        }
                    )
    mb = pd.DataFrame(rows)
    for col in schema.MICROBATCH_COLUMNS:  # columns newer schemas add (rank, ...): null
        if col not in mb:
            mb[col] = None
    mb = mb.astype(schema.MICROBATCH_COLUMNS)
    with OutputDir(root / name, kind="sweep", config={"model": MODEL, "precisions": ["bf16", "mxfp8"]}) as od:
        store.write_table(mb, od.path / store.MICROBATCHES)
    return od.path


def _fit(root: Path, sweep: Path, run: Path, name: str = "fit-tiny-dense") -> Path:
    """fits.json made by the cost model itself (``perfmodel.report.results.analyze``, as ``mxperf fit`` does)."""
    from perfmodel.inputs.load import load_inputs
    from perfmodel.report.results import analyze

    doc = analyze(load_inputs([sweep, run]), n_boot=50, seed=0)  # the run gives the other phases' seconds
    with OutputDir(root / name, kind="fit", config={"inputs": [str(sweep), str(run)]}) as od:
        store.write_json(doc, od.path / store.FITS)
        store.write_text("# fit\n", od.path / store.REPORT)
    return od.path


def gpu_events() -> pd.DataFrame:
    """One device, two streams: kernels with launch records, one late launch (host stall), one unlaunched."""
    rows = []
    corr = 0

    def add(kind, name, tid, device, stream, start, dur, correlation):
        rows.append(
            {
                "kind": kind,
                "name": name,
                "domain": "",
                "pid": 100,
                "tid": tid,
                "device": device,
                "stream": stream,
                "start_ns": start,
                "dur_ns": dur,
                "correlation": correlation,
                "external_id": -1,
                "bytes": -1,
                "end_tid": -1,
            }
        )

    t = 1_000_000
    for step in range(2):
        base = t + step * 2_000_000
        for i in range(8):
            corr += 1
            launch_start = base + i * 150_000
            add("runtime", "cudaLaunchKernel", 7, -1, -1, launch_start, 20_000, corr)
            # kernel i starts when its launch ended or when the previous one finished
            add(
                "kernel",
                f"gemm_{i}",
                -1,
                0,
                7,
                launch_start + 25_000 + (60_000 if i % 3 else 0),
                100_000,
                corr,
            )
        add("range", f"ProfilerStep#{step}", 7, -1, -1, base, 1_400_000, -1)
    df = pd.DataFrame(rows)
    for col, dtype in schema.EVENT_COLUMNS.items():  # columns newer schemas add: their "absent" value
        if col not in df:
            df[col] = -1 if "int" in dtype else ""
    return df[list(schema.EVENT_COLUMNS)].astype(schema.EVENT_COLUMNS)


GPU_NAME = "NVIDIA H100 80GB HBM3"


def kineto_trace(
    path: Path,
    rank: int,
    *,
    steps: int = 3,
    slow: float = 1.0,
    names: tuple[str, str] = ("generate_sequences", "update_actor"),
    gpu_name: str | None = GPU_NAME,
) -> Path:
    """A small Kineto trace (gzipped JSON, as torch.profiler writes it) of one rank: ``steps`` ProfilerSteps,
    each with two top-level ranges (``names``: verl's, which the phase map knows, by default), kernels
    launched by ``cudaLaunchKernel`` (some late: host stall), ``distributedInfo.rank`` and the GPU's name.
    ``slow`` stretches this rank's times (a straggler)."""
    import gzip

    pid, tid = 1000 + rank, 2000 + rank
    events, corr, t_us = [], 0, 1000.0
    for step in range(steps):
        start = t_us
        for name, dur_ms in zip(names, (3.0 * slow, 5.0 * slow), strict=True):
            events.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": name,
                    "pid": pid,
                    "tid": tid,
                    "ts": t_us,
                    "dur": dur_ms * 1e3,
                }
            )
            for k in range(4):
                corr += 1
                launch = t_us + 100.0 + k * dur_ms * 200
                events.append(
                    {
                        "ph": "X",
                        "cat": "cuda_runtime",
                        "name": "cudaLaunchKernel",
                        "pid": pid,
                        "tid": tid,
                        "ts": launch,
                        "dur": 10.0,
                        "args": {"correlation": corr},
                    }
                )
                late = 150.0 if k == 2 else 0.0  # a kernel that waits for a slow launch: host stall
                events.append(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": f"sm90_gemm_{k}",
                        "pid": rank,
                        "tid": 7,
                        "ts": launch + 12.0 + late,
                        "dur": dur_ms * 150,
                        "args": {"correlation": corr, "device": rank, "stream": 7},
                    }
                )
            t_us += dur_ms * 1e3 + 50.0
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": pid,
                "tid": tid,
                "ts": start - 10.0,
                "dur": t_us - start + 20.0,
            }
        )
        t_us += 100.0
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"rank": rank, "world_size": 2, "backend": "nccl"},
        "deviceProperties": [{"id": rank, "name": gpu_name}] if gpu_name else [],
        "traceEvents": events,
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def ingest(root: Path, name: str, traces: list[Path], *extra: str) -> Path:
    """``mxperf ingest TRACES -o ROOT/NAME`` in this process: the real command, its real tables."""
    from mxperf.cli import main

    rc = main(["ingest", *map(str, traces), "-o", str(root / name), *extra])
    if rc != 0:
        raise RuntimeError(f"mxperf ingest {traces} failed with exit {rc}")
    return root / name


def _ingest(root: Path, name: str = "ingest-gpu") -> Path:
    """A 2-rank GPU trace set (rank 1 the straggler), ingested by the real command."""
    src = root.parent / f"{root.name}-traces" / name
    traces = [kineto_trace(src / f"rank-{r}.json.gz", r, slow=1.0 + 0.25 * r) for r in (0, 1)]
    return ingest(root, name, traces)


def ingest_unmapped(root: Path, name: str = "ingest-unmapped") -> Path:
    """One rank whose ranges no phase map knows (``## forward ##`` / ``## backward ##``, as in HTA's samples)."""
    src = root.parent / f"{root.name}-traces" / name
    return ingest(
        root, name, [kineto_trace(src / "rank-0.json.gz", 0, names=("## forward ##", "## backward ##"))]
    )


def knee_fit(root: Path) -> Path:
    """A sweep simulated by the cost model's own simulator with a host/GPU knee (``perfmodel.inputs.simulate.KNEE``:
    launch-bound small micro-batches; wall times cross at 4,250 tokens) and its fit, as ``mxperf fit`` makes
    them: the data chooses the knee ('parts') model, GPU-busy breakeven and measured crossing are present."""
    from perfmodel.inputs.load import load_inputs
    from perfmodel.inputs.simulate import KNEE, simulate_sweep
    from perfmodel.report.results import analyze

    mb = simulate_sweep(
        KNEE, rng=np.random.default_rng(0), repeats=3, sizes=(512, 1024, 2048, 4096, 8192, 16384)
    )
    with OutputDir(
        root / "sweep-knee", kind="sweep", config={"model": "sim", "precisions": ["bf16", "mxfp8"]}
    ) as od:
        store.write_table(mb, od.path / store.MICROBATCHES)
    doc = analyze(load_inputs([root / "sweep-knee"]), n_boot=50, seed=0)
    with OutputDir(root / "fit-knee", kind="fit", config={"inputs": [str(root / "sweep-knee")]}) as od:
        store.write_json(doc, od.path / store.FITS)
        store.write_text("# fit\n", od.path / store.REPORT)
    return root / "fit-knee"


METRIC_LOGS = Path(__file__).resolve().parent / "data" / "metric_logs"


def ingest_metric_logs(root: Path) -> list[Path]:
    """verl metric logs of a BF16 and an MXFP8 run (tests/data/metric_logs), ingested with their labels."""
    return [
        ingest(
            root,
            f"verl-{p}",
            [METRIC_LOGS / f"verl_grpo_{p}.jsonl"],
            "--label",
            f"model=qwen3-8b,precision={p}",
        )
        for p in ("bf16", "mxfp8")
    ]


def _faults(root: Path, name: str = "faults") -> Path:
    """One row per injected fault, as ``mxperf faults`` writes it (``pipeline.experiments.fault_runs.FaultOutcome``)."""
    outcomes = [
        ("flipped_scale_byte", "I1", "I1"),
        ("floor_requant", "I1", "I1,I4"),
        ("dropped_expert", "I2", ""),
        ("gate_up_swapped", "I3", "I3"),
    ]
    rows = [
        {
            "fault": f,
            "invariant": inv,
            "source": "synthetic",
            "caught": bool(by),
            "caught_by": by,
            "first_caught_step": 0 if by else None,
            "silent": not by,
            "error": None,
            "eval_dlogprob_max": 0.1,
            "eval_dlogprob_mean": 0.01,
            "kl_k3_fault": 1e-3,
            "kl_k3_clean": 1e-4,
            "rollout_dlogprob_max": 0.2,
            "steps_done": 3,
            "check_seconds": 0.1,
            "run_seconds": 2.0,
        }
        for f, inv, by in outcomes
    ]
    with OutputDir(
        root / name, kind="run", config={"model": MODEL, "faults": [r[0] for r in outcomes]}
    ) as od:
        store.write_table(pd.DataFrame(rows), od.path / store.FAULT_MATRIX)
    return od.path


def _consistency(root: Path, name: str = "consistency") -> Path:
    """Every pairing at fixed weights, as ``mxperf consistency`` writes it (kind run, consistency.parquet)."""
    pairs = [
        ("bf16", "bf16", 6e-6),
        ("bf16", "mxfp8", 4.7e-4),
        ("mxfp8", "bf16", 5e-4),
        ("mxfp8", "mxfp8", 2.3e-4),
        ("mxfp8", "mxfp8-floor", 4.6e-4),
    ]
    df = pd.DataFrame(
        [
            {
                "model": MODEL,
                "learner": lr,
                "sampler": sp,
                "kl_k1": k3 / 2,
                "kl_k3": k3,
                "token_mult_prob_error": 1 + 50 * k3,
                "num_tokens": 256.0,
            }
            for lr, sp, k3 in pairs
        ]
    )
    with OutputDir(root / name, kind="run", config={"tool": "consistency", "model": MODEL}) as od:
        store.write_table(df, od.path / store.CONSISTENCY)
    return od.path


def make_runs_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    run = _run(root, "run-bf16", "bf16", "bf16")
    _run(root, "run-mxfp8", "mxfp8", "mxfp8", fail_step=4)
    _fit(root, _sweep(root), run)
    _ingest(root)
    ingest_unmapped(root)
    ingest_metric_logs(root)
    _faults(root)
    _consistency(root)
    return root


def add_broken_outputs(root: Path) -> Path:
    """Outputs the dashboard must survive: half-written, corrupt tables (one would be the auto pair), an
    unreadable manifest, a failed run, a fit whose sweep's manifest is broken."""
    half = root / "run-halfwritten"
    half.mkdir()
    store.write_json(
        {"kind": "run", "status": "running", "config": {"model": MODEL, "learner": "mxfp8"}},
        half / store.MANIFEST,
    )
    corrupt = _run(root, "run-corrupt", "mxfp8", "bf16")
    (corrupt / store.METRICS).write_bytes(b"PAR1 this is not parquet")
    (corrupt / store.SYNC_CHECKS).write_bytes(b"")
    bad = root / "bad-manifest"
    bad.mkdir()
    (bad / store.MANIFEST).write_text("{not json")
    newest = _run(root, "run-mxfp8-corrupt", "mxfp8", "mxfp8")  # would be the auto pair by date
    (newest / store.METRICS).write_bytes(b"PAR1 this is not parquet")
    (newest / store.RANGES).write_bytes(b"PAR1 nor this")
    manifest = store.read_json(newest / store.MANIFEST)
    store.write_json({**manifest, "created": "2099-01-01T00:00:00+00:00"}, newest / store.MANIFEST)
    sweep = _sweep(root, "sweep-broken-manifest")
    (sweep / store.MANIFEST).write_text('{"kind": "sweep", "status": ')  # truncated mid-write
    _fit(root, root / "sweep-tiny-dense", root / "run-bf16", name="fit-of-broken-sweep")
    fit_manifest = store.read_json(root / "fit-of-broken-sweep" / store.MANIFEST)
    fit_manifest["config"] = {"inputs": [str(sweep)]}
    fit_manifest["created"] = "2099-01-01T00:00:00+00:00"
    store.write_json(fit_manifest, root / "fit-of-broken-sweep" / store.MANIFEST)
    failed = root / "run-failed"
    failed.mkdir()
    store.write_json(
        {
            "kind": "run",
            "status": "failed",
            "error": "RuntimeError: out of memory",
            "config": {"model": MODEL, "learner": "bf16"},
        },
        failed / store.MANIFEST,
    )
    return root


SECRET = "SECRET-OUTSIDE-MODEL"


def add_symlinked_outputs(root: Path, outside: Path) -> Path:
    """Links leaving RUNS_DIR, each of which the dashboard must refuse (never read, never crash):
    ``linked-manifest/manifest.json`` -> a manifest outside naming the model ``SECRET``; a run whose
    ``sync_checks.parquet`` is a link to a valid table outside; an ingest with a second events table linked
    from outside; ``linked-folder`` -> a whole output folder outside."""
    outside.mkdir(parents=True, exist_ok=True)
    store.write_json(
        {"kind": "run", "status": "complete", "config": {"model": SECRET, "learner": "bf16"}},
        outside / "manifest.json",
    )
    (root / "linked-manifest").mkdir()
    (root / "linked-manifest" / store.MANIFEST).symlink_to(outside / "manifest.json")
    run = _run(root, "run-linked-sync", "bf16", "bf16")
    real = outside / "sync_checks.parquet"
    (run / store.SYNC_CHECKS).replace(real)
    (run / store.SYNC_CHECKS).symlink_to(real)
    ingest = root / "ingest-gpu"
    if ingest.is_dir():
        target = outside / "rank-9.parquet"
        store.write_table(gpu_events(), target)
        (ingest / store.EVENTS_DIR / "rank-9.parquet").symlink_to(target)
    folder = _run(outside, "elsewhere-run", "mxfp8", "mxfp8")
    (root / "linked-folder").symlink_to(folder, target_is_directory=True)
    return root


def add_odd_outputs(root: Path) -> Path:
    """Manifests that are valid JSON but odd: no config, config of the wrong type, an unknown kind, a date
    that is not a date, a fit without fits.json, a fits.json with no models or an incomplete one."""
    odd = {
        "bare-run": {"kind": "run", "status": "complete"},
        "bare-ingest": {"kind": "ingest", "status": "complete", "traces": "oops", "machine": [1, 2]},
        "bare-fit": {"kind": "fit", "status": "complete", "config": {"inputs": "nope"}},
        "fit-empty": {"kind": "fit", "status": "complete"},
        "fit-incomplete": {"kind": "fit", "status": "complete"},
        "sweep-bare": {"kind": "sweep", "status": "complete", "config": [1, 2]},
        "weird-kind": {"kind": "banana", "status": "complete"},
        "config-list": {"kind": "run", "status": "complete", "config": ["a"], "created": "not a date"},
    }
    for name, manifest in odd.items():
        (root / name).mkdir(parents=True)
        store.write_json(manifest, root / name / store.MANIFEST)
    store.write_json({"models": []}, root / "fit-empty" / store.FITS)
    store.write_json({"models": [{"model": "m"}]}, root / "fit-incomplete" / store.FITS)
    return root
