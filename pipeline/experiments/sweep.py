"""``mxperf sweep``: learner update steps on identical data across micro-batch sizes, precisions and global
batch sizes, on any device.

The cost model (``perfmodel``) fits time(n) = fixed + per_token * n per precision (plus a cost paid once per
step, identified by two global batch sizes), so the sweep must vary only n and the global batch. Design:

- **Identical data.** One fixed batch of B sequences x L tokens (solved task problems packed back to back,
  seeded) with fixed advantages, old and sampler log-probs. A global batch of G tokens takes its first
  floor(G / L) sequences, so two global batches share their data. Each size n re-splits the *same* batch into
  micro-batches of floor(n / L) sequences: tokens per step are constant per global batch and the loss is the
  same token mean for every split (``pipeline.learner.grpo``).
- **The runs' model.** ``pretrain_steps`` > 0 times the cached warm start ``mxperf run`` trains from instead
  of a random init (an MoE routes tokens by its weights, so its cost per micro-batch depends on them).
- **Warm-up discarded.** Each (size, global batch, precision) runs ``warmup`` update steps first that are not
  recorded (allocator growth, lazy init, quantizer compilation on a GPU).
- **Interleaved.** Within a repeat, sizes are visited in a seeded shuffled order and, for each size, every
  global batch and precision runs back to back (the precisions' order reversed in every other cell), so slow
  drift of a shared machine hits all precisions alike and neither always runs first.
- **Per micro-batch** rows from the range log (``update/microbatch``): wall seconds (the range synchronizes the
  GPU), real tokens, tokens in the step (``global_tokens``), peak memory, model FLOPs and achieved FLOP/s.
  Weight casts happen inside the micro-batch that needs them: micro-batch 0 of each step (``per-step``), or
  every micro-batch (``per-microbatch``). ``mfu`` needs the hardware's peak and is null: never guessed.
- **Traced window.** With a capture, the last ``trace_repeats`` repeats run under the profiler, after one
  unrecorded profiler warm-up step (CUPTI's start-up cost); their rows say ``traced`` and get GPU busy / host
  stall from the trace (:mod:`pipeline.experiments.sweep_tables`).
- **Rows as they finish.** ``on_rows`` receives the table after every measured step, so an interrupted sweep
  keeps what it measured.
"""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from pipeline.experiments.session import build_tokenizer
from pipeline.experiments.settings import ExperimentSettings, at_least
from pipeline.experiments.sweep_tables import to_frame
from pipeline.learner.engine import LEARNER_PRECISIONS
from pipeline.learner.grpo import GRPOBatch, GRPOConfig
from pipeline.model.presets import build_model, flops_per_token, get_preset
from pipeline.model.task import AdditionTask
from tracing.capture.ranges import RangeLog
from tracing.outputs.errors import InputError

DEFAULT_SIZES = (128, 256, 384, 512, 768, 1024, 1536, 2048)


@dataclass(frozen=True)
class SweepConfig(ExperimentSettings):
    precisions: tuple[str, ...] = ("bf16", "mxfp8")
    sizes: tuple[int, ...] = DEFAULT_SIZES
    repeats: int = 3
    warmup: int = 1
    seq_len: int = 128
    global_tokens: tuple[int, ...] | int | None = None  # tokens per step; default: the largest size
    trace_repeats: int = 1
    sizes_order_seed: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.precisions:
            raise InputError("--precisions is empty; give e.g. bf16,mxfp8")
        bad = [p for p in self.precisions if p not in LEARNER_PRECISIONS]
        if bad:
            raise InputError(
                f"unknown learner precision {bad[0]!r}; choose from {', '.join(LEARNER_PRECISIONS)}"
            )
        if len(set(self.precisions)) != len(self.precisions):
            raise InputError(f"--precisions lists a precision twice: {','.join(self.precisions)}")
        self.check_gemm(self.precisions)
        if not self.sizes:
            raise InputError("--tokens-per-microbatch is empty; give e.g. 256,512,1024")
        at_least(
            1, tokens_per_microbatch=min(self.sizes), repeats=self.repeats, trace_repeats=self.trace_repeats
        )
        at_least(0, warmup=self.warmup)
        if self.seq_len < 8:
            raise InputError(f"--seq-len must be >= 8, got {self.seq_len}")
        small = [n for n in self.sizes if n < self.seq_len]
        if small:
            raise InputError(
                f"--tokens-per-microbatch {small[0]} is smaller than one sequence ({self.seq_len} tokens); "
                f"use sizes >= {self.seq_len} or a smaller --seq-len"
            )
        g = self.global_tokens
        batches = (g,) if isinstance(g, int) else tuple(g) if g is not None else ()
        object.__setattr__(self, "global_tokens", batches or None)
        if batches:
            at_least(1, global_batch=min(batches))
            if min(batches) < max(self.sizes):
                raise InputError(
                    f"--global-batch {min(batches)} is smaller than the largest size {max(self.sizes)}; every "
                    "global batch must hold at least one micro-batch of every size"
                )
            if len({b // self.seq_len for b in batches}) != len(batches):
                raise InputError(
                    f"--global-batch {','.join(map(str, batches))}: two batches round to the same number of "
                    f"{self.seq_len}-token sequences"
                )

    @property
    def global_batches(self) -> tuple[int, ...]:
        """Tokens per step asked for, smallest first (default: one global batch of the largest size)."""
        return tuple(sorted(self.global_tokens or (max(self.sizes),)))  # type: ignore[arg-type]

    def sequences(self, global_tokens: int) -> int:
        return max(1, global_tokens // self.seq_len)

    @property
    def num_sequences(self) -> int:
        """Sequences of the largest global batch (the fixed batch every smaller one is a prefix of)."""
        return self.sequences(max(self.global_batches))


def fixed_batch(cfg: SweepConfig) -> GRPOBatch:
    """The sweep's one batch (see the module docstring); identical for identical config, on the CPU."""
    task = AdditionTask(1, 3)
    tok = build_tokenizer(AdditionTask(1, 2))
    gen = torch.Generator().manual_seed(cfg.seed)
    rows = []
    problems = iter(task.problems(cfg.num_sequences * cfg.seq_len, seed=cfg.seed + 17))
    for _ in range(cfg.num_sequences):
        seq: list[int] = []
        while len(seq) < cfg.seq_len:
            p = next(problems)
            seq += [*tok.encode(p.prompt + p.answer), tok.eos_id]
        rows.append(seq[: cfg.seq_len])
    ids = torch.tensor(rows, dtype=torch.long)
    b, t = ids.shape
    old = -torch.rand(b, t - 1, generator=gen) * 3.0
    return GRPOBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        response_mask=torch.ones(b, t - 1),
        advantages=torch.randn(b, generator=gen),
        old_logprobs=old,
        sampler_logprobs=old + 0.01 * torch.randn(b, t - 1, generator=gen),
    )


def initial_model(cfg: SweepConfig) -> Any:
    """The weights the sweep times: a random init, or with ``pretrain_steps`` the cached warm start ``mxperf
    run`` trains from (its default 1-2 digit task: the same cache entry). An MoE's routing follows the
    weights, so its time per micro-batch does too (tiny-moe, CPU: random init ~20 % slower)."""
    preset = get_preset(cfg.model)
    if cfg.pretrain_steps <= 0:
        return build_model(preset, cfg.seed)
    from pipeline.model.pretrain import PretrainConfig, warm_start

    task = AdditionTask(1, 2)
    cfg_pre = PretrainConfig(steps=cfg.pretrain_steps, seed=cfg.seed)
    model, _ = warm_start(preset, task, build_tokenizer(task), cfg_pre, device=cfg.torch_device)
    return model


def make_learners(cfg: SweepConfig, ranges: RangeLog) -> dict[str, Any]:
    """One learner per precision, all from the same initial weights (built once, copied)."""
    from pipeline.learner.engine import HFLearner

    base = initial_model(cfg)
    return {
        p: HFLearner(copy.deepcopy(base), p, config=GRPOConfig(), ranges=ranges, **cfg.learner_options())
        for p in cfg.precisions
    }


@dataclass(frozen=True)
class Cell:
    precision: str
    size: int
    global_tokens: int


def _plan(cfg: SweepConfig, rng: random.Random, repeat: int = 0) -> list[Cell]:
    """One repeat: sizes in a seeded shuffled order; per (size, global batch) cell every precision back to back,
    their order reversed in every other cell (and repeat), so neither precision always runs first."""
    order = list(cfg.sizes)
    rng.shuffle(order)
    cells = [(n, g) for n in order for g in cfg.global_batches]
    out = []
    for j, (n, g) in enumerate(cells):
        precs = cfg.precisions if (j + repeat) % 2 == 0 else tuple(reversed(cfg.precisions))
        out += [Cell(p, n, g) for p in precs]
    return out


def run_sweep(
    cfg: SweepConfig,
    *,
    ranges: RangeLog | None = None,
    log: Callable[[str], None] = lambda m: None,
    capture: Callable[[], contextlib.AbstractContextManager[Callable[[], None]]] | None = None,
    on_rows: Callable[[pd.DataFrame], None] | None = None,
    learners: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """Run the sweep; returns one row per measured micro-batch (contract columns + extras).

    ``capture``: enters the profiler for the traced window and yields its per-step callback (None: no trace).
    ``on_rows``: called with the table so far after every measured step. ``learners``: prebuilt ones.
    """
    ranges = ranges or RangeLog()
    batch = fixed_batch(cfg)
    learners = learners or make_learners(cfg, ranges)
    preset = get_preset(cfg.model)
    fpt = flops_per_token(preset, cfg.seq_len, training=True)
    steps = {g: batch.select(list(range(cfg.sequences(g)))) for g in cfg.global_batches}
    for size in cfg.sizes:  # warm-up, not recorded
        for g in cfg.global_batches:
            for prec in cfg.precisions:
                for _ in range(cfg.warmup):
                    learners[prec].train_step(steps[g], size)
    rng = random.Random(cfg.sizes_order_seed)
    plans = [_plan(cfg, rng, r) for r in range(cfg.repeats)]
    first_traced = cfg.repeats - min(cfg.trace_repeats, cfg.repeats) if capture is not None else cfg.repeats
    rows: list[dict[str, Any]] = []

    def measure(cell: Cell, repeat: int, traced: bool) -> None:
        learner = learners[cell.precision]
        attrs = {"precision": cell.precision, "tokens_per_microbatch": cell.size, "repeat": repeat}
        with ranges.range("sweep/step", global_tokens=cell.global_tokens, **attrs) as a:
            step = learner.step_count
            learner.train_step(steps[cell.global_tokens], cell.size)
            a["learner_step"] = step
        step_tokens = int(steps[cell.global_tokens].attention_mask.sum())
        records = _microbatch_records(ranges, cell.precision, step)
        rows.extend(_rows(cfg, cell, repeat, step, records, fpt, step_tokens, traced))
        if on_rows is not None:
            on_rows(to_frame(rows))

    for repeat in range(first_traced):
        for cell in plans[repeat]:
            measure(cell, repeat, traced=False)
        log(f"repeat {repeat + 1}/{cfg.repeats} done")
    if first_traced < cfg.repeats:
        with _traced(capture) as traced_step:  # type: ignore[arg-type]
            warm = plans[first_traced][0]  # the profiler's warm-up step: run under it, never recorded
            learners[warm.precision].train_step(steps[warm.global_tokens], warm.size)
            traced_step()
            for repeat in range(first_traced, cfg.repeats):
                for cell in plans[repeat]:
                    measure(cell, repeat, traced=True)
                    traced_step()
                log(f"repeat {repeat + 1}/{cfg.repeats} done (traced)")
    return to_frame(rows)


def _microbatch_records(ranges: RangeLog, precision: str, step: int) -> list[Any]:
    """The ``update/microbatch`` ranges of one learner step (the newest records: scanned from the end)."""
    out = []
    for r in reversed(ranges.records):
        if r.name == "update/microbatch" and r.attrs.get("precision") == precision:
            if int(r.attrs["step"]) == step:
                out.append(r)
            elif int(r.attrs["step"]) < step:
                break
    return sorted(out, key=lambda r: int(r.attrs["microbatch"]))


@contextlib.contextmanager
def _traced(capture: Callable[[], Any]) -> Iterator[Callable[[], None]]:
    with capture() as step:
        yield step


def _rows(
    cfg: SweepConfig,
    cell: Cell,
    repeat: int,
    step: int,
    records: list[Any],
    fpt: float,
    step_tokens: int,
    traced: bool,
) -> list[dict[str, Any]]:
    out = []
    for rec in records:
        tokens = int(rec.attrs["tokens"])
        seconds = rec.dur_ns / 1e9
        flops = fpt * tokens
        out.append(
            {
                "model": cfg.model,
                "precision": cell.precision,
                "phase": "update",
                "tokens_per_microbatch": cell.size,
                "num_tokens": tokens,
                "repeat": repeat,
                "step": step,
                "microbatch": int(rec.attrs["microbatch"]),
                "seconds": seconds,
                "gpu_busy_seconds": None,
                "host_stall_seconds": None,
                "peak_mem_bytes": float(rec.attrs.get("peak_mem_bytes", float("nan"))),
                "flops": flops,
                "source": "sweep",
                "global_tokens": step_tokens,
                "padded_tokens": int(rec.attrs["padded_tokens"]),
                "achieved_flop_per_s": flops / seconds if seconds > 0 else None,
                "mfu": None,
                "traced": traced,
            }
        )
    return out
