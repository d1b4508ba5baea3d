"""``mxperf run``: an instrumented GRPO run written to a run directory (docs/contracts.md, "Output directories").

    manifest.json               kind run, status running -> complete | failed | interrupted, config, machine,
                                learner_device / sampler_device, the learner's GEMM backend, step_shapes
                                (per step the drawn max new tokens and max digits)
    tokenizer.json              the run's tokenizer
    metrics.parquet             one row per step: seconds per phase, reward, mismatch metrics, check cost,
                                max_new_tokens, prompt_tokens, response_tokens, longest_response_tokens
    ranges.parquet              the host range log (step, generate, logprob, update, update/microbatch,
                                sync, sync/check)
    sync_checks.parquet         one row per (step, invariant); step -1 is the initial push
    eval_fixed_weights.parquet  mismatch on the fixed evaluation batch at the first and last weights
    trace/rank-0.json.gz        with --trace (the steps --trace-steps picks; by default 2 steps after one
                                skipped and one profiler warm-up step), and
    trace/capture-rank-0.json   the capture manifest (schedule, CUDA activity, files)
    trace/sampler/*.json.gz     with --trace and --sampler-engine vllm: vLLM's own profiler, same steps

Tables are written when the run ends, however it ends (a failed run keeps the steps it finished, and its
manifest says ``failed`` with the error), so nothing half-written is ever presented as complete.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import pandas as pd

from pipeline.experiments.load import record as record_load
from pipeline.experiments.loop import CHECK_POLICIES, RLLoop, evaluate_pairing
from pipeline.experiments.session import RunConfig, Session
from pipeline.model.pretrain import progress_lines
from tracing.capture.profiler import CaptureConfig
from tracing.capture.ranges import RangeLog
from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.manifest import OutputDir


def eval_fixed_batch(session: Session, when: str, version: int) -> dict[str, Any]:
    """Mismatch of the current pairing on the fixed evaluation batch (responses: the problems' answers)."""
    tok = session.tokenizer
    prompts = [tok.encode(p.prompt) for p in session.eval_problems]
    responses = [[*tok.encode(p.answer), tok.eos_id] for p in session.eval_problems]
    row: dict[str, Any] = {"when": when, "version": version}
    row.update(evaluate_pairing(session.learner, session.sampler, prompts, responses, session.pad_id))
    row.update(
        {
            "learner": session.cfg.learner,
            "sampler": session.cfg.sampler,
            "grid_fraction": session.cfg.grid_fraction,
            "kv_cache": session.cfg.kv_cache,
        }
    )
    return row


def _check_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    from pipeline.sync.invariants import SYNC_CHECK_COLUMNS

    df = pd.DataFrame(rows, columns=list(SYNC_CHECK_COLUMNS))
    return df.astype({"step": "int64", "passed": "bool", "check_seconds": "float64"})


def execute_run(
    cfg: RunConfig,
    out_dir: str | os.PathLike[str],
    *,
    trace: CaptureConfig | None = None,
    check_sync: str = "every",
    strict: bool = False,
    force: bool = False,
    command: Sequence[str] | None = None,
    log: Callable[[str], None] = lambda msg: None,
    loop_factory: Callable[..., RLLoop] | None = None,
) -> dict[str, Any]:
    """Run ``cfg.steps`` RL steps into ``out_dir``; returns the ``--json`` summary.

    ``trace``: the capture schedule (:func:`pipeline.experiments.profiling.parse_trace_steps`), or None for no trace.
    """
    from pipeline.experiments.profiling import capture_trace, manifest_fields

    if check_sync not in CHECK_POLICIES:
        raise InputError(f"--check-sync must be one of {', '.join(CHECK_POLICIES)}, got {check_sync!r}")
    config = {**asdict(cfg), "check_sync": check_sync, "strict": strict, **manifest_fields(trace)}
    metrics: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    ranges = RangeLog(encode_attrs=trace is not None)  # traced names carry step / micro-batch / precision
    od = OutputDir(
        out_dir, kind="run", command=command, config=config, compute_dtype=cfg.compute_dtype, force=force
    )
    with od:
        load_start = record_load(od, "start")
        try:
            # A sampler in its own process (vLLM) is traced by its own profiler, bracketed with the run's.
            own_process = trace is not None and cfg.sampler_engine == "vllm"
            sampler_dir = od.path / store.TRACE_DIR / store.SAMPLER_TRACE_DIR if own_process else None
            progress = progress_lines(cfg.pretrain_steps, log)  # the first warm start is long and silent
            session = Session(cfg, ranges=ranges, sampler_profile_dir=sampler_dir, progress=progress)
            loop = None
            try:  # from here on the sampler (maybe a process of its own) is closed however the run ends
                session.tokenizer.save(od.path)
                engines = session.engine_info()
                od.update(
                    warm_start=session.warm_start_meta,
                    engines=engines,
                    learner_device=engines["learner_device"],
                    sampler_device=engines["sampler_device"],
                    step_shapes=cfg.step_shapes(),
                )
                loop = _make_loop(session, check_sync, strict, loop_factory)
                checks.extend(loop.initial_sync())
                evals.append(eval_fixed_batch(session, "initial", loop.version))
                companions = [session.sampler] if sampler_dir is not None else []
                with capture_trace(od.path, trace, companions=companions, log=log) as traced_step:
                    for step in range(cfg.steps):
                        result = loop.step(step)
                        traced_step()
                        metrics.append(result.metrics)
                        checks.extend(result.check_rows)
                        m = result.metrics
                        log(
                            f"step {step}: reward {m['reward_mean']:.3f} kl_k3 {m['kl_k3']:.2e} "
                            f"step {m['step_s']:.2f}s checks failed {m['checks_failed']}"
                        )
                evals.append(eval_fixed_batch(session, "final", loop.version))  # before the sampler closes
            finally:
                _close(loop, session)
        finally:
            _write_tables(od, metrics, checks, evals, ranges)
            record_load(od, "end", load_start)
        failed = sum(not c["passed"] for c in checks)
        od.update(steps_completed=len(metrics), checks_failed=failed)
    return {
        "schema_version": store.SCHEMA_VERSION,
        "run_dir": str(od.path),
        "status": "complete",
        "steps": len(metrics),
        "checks_failed": failed,
        "reward_mean_last": metrics[-1]["reward_mean"] if metrics else None,
        "kl_k3_mean": float(pd.Series([m["kl_k3"] for m in metrics]).mean()) if metrics else None,
    }


def _make_loop(
    session: Session, check_sync: str, strict: bool, loop_factory: Callable[..., RLLoop] | None
) -> RLLoop:
    cfg = session.cfg
    if loop_factory is not None:
        return loop_factory(session, check_sync=check_sync, strict=strict, async_mode=cfg.async_mode)
    from pipeline.engines.factory import make_sync_and_checker

    syncer, checker = make_sync_and_checker(cfg.sampler_engine, cfg.learner_engine)
    return RLLoop(
        session,
        check_sync=check_sync,
        strict=strict,
        async_mode=cfg.async_mode,
        syncer=syncer,
        checker=checker,
    )


def _close(loop: RLLoop | None, session: Session) -> None:
    """Finish pending work and close the sampler (the loop does both; without a loop, close it directly)."""
    if loop is not None:
        loop.close()
        return
    close = getattr(session.sampler, "close", None)
    if close:
        close()


def _write_tables(
    od: OutputDir,
    metrics: list[dict[str, Any]],
    checks: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    ranges: RangeLog,
) -> None:
    store.write_table(pd.DataFrame(metrics), od.path / store.METRICS)
    store.write_table(ranges.to_frame(), od.path / store.RANGES)
    store.write_table(_check_frame(checks), od.path / store.SYNC_CHECKS)
    store.write_table(pd.DataFrame(evals), od.path / store.EVAL_FIXED_WEIGHTS)
