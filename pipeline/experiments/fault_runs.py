"""Run each weight-sync fault live in the real RL loop and measure what it catches and what it costs.

For every fault (``pipeline.sync.faults.FAULTS``) one short GRPO run (learner ``mxfp8``, sampler ``mxfp8``: the
grid-matched pairing, where every invariant has something to check) is started from the same seed, the fault
is applied to its sampler, and the loop runs with ``--check-sync every`` and without ``--strict``, as a
production run that logs checks would. Per fault we record:

- ``caught_by``: every invariant that failed at some step; ``caught``: whether the fault's own invariant did;
- ``silent``: the run finished all steps without any error (what happens with checks off);
- ``eval_dlogprob_max`` / ``_mean``: on the fixed evaluation batch, after every sync, the faulted sampler's
  log-probs against a **clean shadow sampler** loaded with the same learner weights (paired: same weights,
  same tokens, so any difference is the fault's);
- ``kl_k3_fault`` / ``kl_k3_clean``: KL k3 of the faulted and of the shadow sampler against the learner on
  that batch (mean over syncs);
- ``rollout_dlogprob_max``: the run's own rollouts against a clean run with the same settings, at the first
  step where they differ, over the tokens whose whole prefix is identical (the only place where a fault that
  never touches the evaluation batch -- a request decoding through a sync -- shows up).

Prompts recur every ``PROMPT_PERIOD`` steps (a small dataset trained for several epochs), which is what
makes a stale prefix cache reachable, as in NeMo-RL PR #4018.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.experiments.settings import ExperimentSettings
from pipeline.sync.faults import Fault
from tracing.outputs.errors import InputError

PROMPT_PERIOD = 2


@dataclass(frozen=True)
class FaultRunSettings(ExperimentSettings):
    pretrain_steps: int = 60  # warm start (cached): a random policy earns no reward, so GRPO would not move
    steps: int = 3
    prompts_per_step: int = 4
    samples_per_prompt: int = 2
    max_new_tokens: int = 4
    eval_prompts: int = 8
    lr: float = 1e-3  # large enough that scale bytes move between syncs within a few steps

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.steps < 2:
            raise InputError(
                f"fault runs need at least 2 steps (a refit after the first load), got {self.steps}"
            )
        self.run_config(False, False)  # every other field is checked where the runs are configured

    def run_config(self, kv_fp8: bool, async_mode: bool) -> Any:
        """The RunConfig of one fault run: learner and sampler on the shared MXFP8 grid."""
        from pipeline.experiments.session import RunConfig

        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return RunConfig(
            **fields,
            learner="mxfp8",
            sampler="mxfp8",
            kv_cache="fp8" if kv_fp8 else "bf16",
            async_mode=async_mode,
        )


@dataclass
class RunTrace:
    """What one run produced: check rows, per-sync eval log-probs, rollouts per step, the error if any."""

    check_rows: list[dict[str, Any]] = field(default_factory=list)
    eval_dlogprob: list[float] = field(default_factory=list)  # max |faulted - shadow| per sync
    eval_dlogprob_mean: list[float] = field(default_factory=list)
    kl_fault: list[float] = field(default_factory=list)
    kl_clean: list[float] = field(default_factory=list)
    rollouts: list[list[Any]] = field(default_factory=list)
    error: str | None = None
    steps_done: int = 0
    seconds: float = 0.0


@dataclass
class FaultOutcome:
    fault: str
    invariant: str
    source: str
    caught: bool
    caught_by: list[str]
    first_caught_step: int | None
    silent: bool
    error: str | None
    eval_dlogprob_max: float
    eval_dlogprob_mean: float
    kl_k3_fault: float
    kl_k3_clean: float
    rollout_dlogprob_max: float
    steps_done: int
    check_seconds: float
    run_seconds: float

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["caught_by"] = ",".join(self.caught_by)
        return d


def settings_key(fault: Fault | None) -> tuple[bool, bool]:
    needs = fault.needs if fault else frozenset()
    return ("kv-fp8" in needs, "async" in needs)


def _shadow(session: Any) -> Any:
    from pipeline.model.presets import build_config
    from pipeline.sampler.engine import Sampler

    e = session.sampler
    return Sampler(
        build_config(session.preset),
        e.mode,
        grid_fraction=e.grid_fraction,
        kv_cache=e.kv_cache,
        calibration_prompts=e.calibration_prompts,
        eos_id=e.eos_id,
        pad_id=e.pad_id,
        device=e.device,
    )


def _record_rollouts(engine: Any, sink: list[list[Any]]) -> None:
    original = engine.generate

    def generate(prompts: Any, params: Any) -> list[Any]:
        out = original(prompts, params)
        sink.append(out)
        return out

    engine.generate = generate


def _repeat_prompts(session: Any, period: int) -> None:
    original = session.step_prompts
    session.step_prompts = lambda step: original(step % period)


def _measure(session: Any, shadow: Any, trace: RunTrace) -> None:
    from pipeline.experiments.loop import evaluate_pairing

    tok = session.tokenizer
    prompts = [tok.encode(p.prompt) for p in session.eval_problems]
    responses = [[*tok.encode(p.answer), tok.eos_id] for p in session.eval_problems]
    lp_f = session.sampler.score(prompts, responses)
    lp_s = shadow.score(prompts, responses)
    diffs = [abs(a - b) for ra, rb in zip(lp_f, lp_s, strict=True) for a, b in zip(ra, rb, strict=True)]
    trace.eval_dlogprob.append(max(diffs))
    trace.eval_dlogprob_mean.append(sum(diffs) / len(diffs))
    trace.kl_fault.append(
        evaluate_pairing(session.learner, session.sampler, prompts, responses, session.pad_id)["kl_k3"]
    )
    trace.kl_clean.append(
        evaluate_pairing(session.learner, shadow, prompts, responses, session.pad_id)["kl_k3"]
    )


def run_once(settings: FaultRunSettings, fault: Fault | None) -> RunTrace:
    """One short run with ``fault`` applied to its sampler (None: a clean run)."""
    from pipeline.experiments.loop import RLLoop
    from pipeline.experiments.session import Session
    from pipeline.sync.weight_sync import WeightSync

    kv_fp8, async_mode = settings_key(fault)
    t0 = time.perf_counter()
    trace = RunTrace()
    session = Session(settings.run_config(kv_fp8, async_mode))
    _repeat_prompts(session, PROMPT_PERIOD)
    shadow = _shadow(session) if fault is not None else None
    _record_rollouts(session.sampler, trace.rollouts)
    if fault is not None:
        fault.apply(session.sampler)
    loop = RLLoop(session, check_sync="every", strict=False, async_mode=async_mode)
    sync = WeightSync()
    try:
        trace.check_rows += loop.initial_sync()
        for step in range(settings.steps):
            if shadow is not None:
                sync.sync(session.learner, shadow, loop.version)
                _measure(session, shadow, trace)
            trace.check_rows += loop.step(step).check_rows
            trace.steps_done = step + 1
        if shadow is not None:
            sync.sync(session.learner, shadow, loop.version)
            _measure(session, shadow, trace)
    except Exception as exc:  # the run stopping is an outcome here, not a crash of the tool
        trace.error = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            loop.close()
        except Exception as exc:
            trace.error = trace.error or f"{type(exc).__name__}: {exc}"
        for engine in (shadow,):
            if engine is not None:
                engine.close()
    trace.seconds = time.perf_counter() - t0
    return trace


def rollout_delta(faulted: list[list[Any]], clean: list[list[Any]]) -> float:
    """Max |log-prob difference| at the first generate call whose rollouts differ, over tokens whose whole
    prefix (prompt and earlier response tokens) and the token itself are identical in both runs."""
    for fa, cl in zip(faulted, clean, strict=False):
        worst, differs = 0.0, False
        for a, b in zip(fa, cl, strict=False):
            if a.prompt_ids != b.prompt_ids:
                differs = True
                continue
            for ta, tb, la, lb in zip(a.response_ids, b.response_ids, a.logprobs, b.logprobs, strict=False):
                if ta != tb:
                    differs = True
                    break
                d = abs(la - lb)
                differs |= d > 0
                worst = max(worst, d)
        if differs:
            return worst
    return 0.0


def summarize(fault: Fault, trace: RunTrace, clean: RunTrace) -> FaultOutcome:
    failed = [r for r in trace.check_rows if not r["passed"]]
    caught_by = sorted({r["invariant"] for r in failed})
    own = [r["step"] for r in failed if r["invariant"] == fault.invariant]

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else math.nan

    return FaultOutcome(
        fault=fault.name,
        invariant=fault.invariant,
        source=fault.source,
        caught=bool(own),
        caught_by=caught_by,
        first_caught_step=min(own) if own else None,
        silent=trace.error is None,
        error=trace.error,
        eval_dlogprob_max=max(trace.eval_dlogprob, default=math.nan),
        eval_dlogprob_mean=mean(trace.eval_dlogprob_mean),
        kl_k3_fault=mean(trace.kl_fault),
        kl_k3_clean=mean(trace.kl_clean),
        rollout_dlogprob_max=rollout_delta(trace.rollouts, clean.rollouts),
        steps_done=trace.steps_done,
        check_seconds=sum(r["check_seconds"] for r in trace.check_rows),
        run_seconds=trace.seconds,
    )


def run_matrix(
    settings: FaultRunSettings, faults: list[Fault], log: Any = lambda msg: None
) -> tuple[list[FaultOutcome], list[dict[str, Any]]]:
    """Run a clean reference per run setting, then every fault; returns outcomes and the clean runs' checks."""
    clean: dict[tuple[bool, bool], RunTrace] = {}
    outcomes = []
    for fault in faults:
        key = settings_key(fault)
        if key not in clean:
            log(f"clean run (kv fp8={key[0]}, async={key[1]})")
            clean[key] = run_once(settings, None)
            if clean[key].error:
                raise RuntimeError(f"the clean reference run failed: {clean[key].error}")
        log(f"fault {fault.name}")
        outcomes.append(summarize(fault, run_once(settings, fault), clean[key]))
    clean_rows = [
        dict(r, run=f"clean kv_fp8={k[0]} async={k[1]}") for k, t in clean.items() for r in t.check_rows
    ]
    return outcomes, clean_rows


INVARIANT_IDS = ("I1", "I2", "I3", "I4", "I5", "I6", "I7")


def outcome_rows(outcomes: list[FaultOutcome], model: str) -> list[dict[str, Any]]:
    """One row per fault for ``fault_matrix.parquet``: a bool per invariant (failed at some step) + measures."""
    rows = []
    for o in outcomes:
        row: dict[str, Any] = {"model": model, "fault": o.fault, "invariant": o.invariant}
        row.update({i: i in o.caught_by for i in INVARIANT_IDS})
        # keeps caught_by ("I2,I7"), which the dashboard's fault grid reads
        row.update({k: v for k, v in o.as_dict().items() if k not in ("fault", "invariant")})
        rows.append(row)
    return rows


def render_matrix(outcomes: list[FaultOutcome]) -> str:
    """The fault x check matrix (X = that check failed; [X] = the fault's own invariant) and the damage."""
    head = (
        f"{'fault':<22}"
        + "".join(f"{i:>5}" for i in INVARIANT_IDS)
        + "  own     silent  dlogp_eval  dlogp_roll"
    )
    head += "   kl_k3 fault / clean"
    lines = [head, "-" * len(head)]
    for o in outcomes:
        cells = []
        for i in INVARIANT_IDS:
            mark = "X" if i in o.caught_by else "."
            cells.append(f"{'[' + mark + ']' if i == o.invariant else mark:>5}")
        own = "caught" if o.caught else "MISSED"
        silent = "yes" if o.silent else "no"
        lines.append(
            f"{o.fault:<22}{''.join(cells)}  {own:<7} {silent:<7} {o.eval_dlogprob_max:>10.3g}  "
            f"{o.rollout_dlogprob_max:>10.3g}   {o.kl_k3_fault:.3g} / {o.kl_k3_clean:.3g}"
        )
    caught = sum(o.caught for o in outcomes)
    lines.append(f"{caught} of {len(outcomes)} faults caught by their own invariant")
    return "\n".join(lines)
