"""``mxperf sweep``: learner update steps on identical data across micro-batch sizes and precisions.

The cost model (``perfmodel``) fits time(n) = fixed + per_token * n per precision, so the sweep must vary
only n. Design:

- **Identical data.** One fixed global batch of B sequences x L tokens (solved task problems packed back to
  back, seeded) with fixed advantages, old and sampler log-probs. Each size n re-splits the *same* batch
  into micro-batches of floor(n / L) sequences, so tokens per step are constant (B x L) and the loss is
  the same token mean for every split (``pipeline.learner.grpo``).
- **Warm-up discarded.** Each (precision, size) runs ``warmup`` update steps first that are not recorded
  (allocator growth, first-touch page faults, lazy init).
- **Interleaved.** Within a repeat, sizes are visited in a seeded shuffled order and, for each size, every
  precision runs back to back, so slow drift of a shared machine hits all precisions alike.
- **Per micro-batch** rows from the range log (``update/microbatch``): wall seconds, real tokens, peak
  memory (CUDA max allocated; CPU resident-set growth to the end of the forward), model FLOPs
  (``pipeline.model.presets.flops_per_token`` x tokens) and achieved FLOP/s. ``mfu`` needs the hardware's peak and
  is null here: an unknown peak is never guessed. GPU busy / host-stall seconds come from the trace when
  ``--trace`` ran on a GPU; on CPU they are null (``gpu_reason`` in the manifest says why).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from pipeline.experiments.session import LEARNER_PRECISIONS, build_tokenizer
from pipeline.learner.grpo import GRPOBatch, GRPOConfig
from pipeline.model.presets import build_model, flops_per_token, get_preset, require_trainable
from pipeline.model.task import AdditionTask
from tracing.capture.ranges import RangeLog
from tracing.outputs.errors import InputError

DEFAULT_SIZES = (128, 256, 384, 512, 768, 1024, 1536, 2048)
NO_GPU_REASON = "CPU-only sweep: no GPU ops, GPU busy and host stall are null"


@dataclass(frozen=True)
class SweepConfig:
    model: str = "tiny-dense"
    precisions: tuple[str, ...] = ("bf16", "mxfp8")
    sizes: tuple[int, ...] = DEFAULT_SIZES
    repeats: int = 3
    warmup: int = 1
    seq_len: int = 128
    global_tokens: int | None = None  # default: the largest size (>= one micro-batch per step)
    seed: int = 0
    compute_dtype: str = "bfloat16"
    sizes_order_seed: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        require_trainable(get_preset(self.model))
        if not self.precisions:
            raise InputError("--precisions is empty; give e.g. bf16,mxfp8")
        bad = [p for p in self.precisions if p not in LEARNER_PRECISIONS]
        if bad:
            raise InputError(
                f"unknown learner precision {bad[0]!r}; choose from {', '.join(LEARNER_PRECISIONS)}"
            )
        if not self.sizes:
            raise InputError("--tokens-per-microbatch is empty; give e.g. 256,512,1024")
        if self.repeats < 1 or self.warmup < 0:
            raise InputError(f"--repeats must be >= 1 and --warmup >= 0, got {self.repeats}, {self.warmup}")
        if self.seq_len < 8:
            raise InputError(f"--seq-len must be >= 8, got {self.seq_len}")
        small = [n for n in self.sizes if n < self.seq_len]
        if small:
            raise InputError(
                f"--tokens-per-microbatch {small[0]} is smaller than one sequence ({self.seq_len} tokens); "
                f"use sizes >= {self.seq_len} or a smaller --seq-len"
            )
        if self.global_tokens is not None and self.global_tokens < max(self.sizes):
            raise InputError(
                f"--global-tokens {self.global_tokens} is smaller than the largest size {max(self.sizes)}"
            )

    @property
    def num_sequences(self) -> int:
        total = self.global_tokens or max(self.sizes)
        return max(1, total // self.seq_len)


def fixed_batch(cfg: SweepConfig) -> GRPOBatch:
    """The sweep's one global batch (see the module docstring); identical for identical config."""
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


def _learners(cfg: SweepConfig, ranges: RangeLog) -> dict[str, Any]:
    from pipeline.learner.engine import HFLearner

    preset = get_preset(cfg.model)
    return {
        p: HFLearner(
            build_model(preset, cfg.seed),
            p,
            compute_dtype=cfg.compute_dtype,
            config=GRPOConfig(),
            ranges=ranges,
        )
        for p in cfg.precisions
    }


def run_sweep(
    cfg: SweepConfig, *, ranges: RangeLog | None = None, log: Callable[[str], None] = lambda m: None
) -> pd.DataFrame:
    """Run the sweep; returns one row per measured micro-batch (contract columns + extras)."""
    ranges = ranges or RangeLog()
    batch = fixed_batch(cfg)
    learners = _learners(cfg, ranges)
    preset = get_preset(cfg.model)
    fpt = flops_per_token(preset, cfg.seq_len, training=True)
    for size in cfg.sizes:  # warm-up, not recorded
        for prec in cfg.precisions:
            for _ in range(cfg.warmup):
                learners[prec].train_step(batch, size)
    measured: list[tuple[int, tuple[str, int, int]]] = []  # (learner step, (precision, size, repeat))
    rng = random.Random(cfg.sizes_order_seed)
    rows: list[dict[str, Any]] = []
    for repeat in range(cfg.repeats):
        order = list(cfg.sizes)
        rng.shuffle(order)
        for size in order:
            for prec in cfg.precisions:
                learner = learners[prec]
                with ranges.range(
                    "sweep/step", precision=prec, tokens_per_microbatch=size, repeat=repeat
                ) as a:
                    step = learner.step_count
                    learner.train_step(batch, size)
                    a["learner_step"] = step
                measured.append((step, (prec, size, repeat)))
        log(f"repeat {repeat + 1}/{cfg.repeats} done")
    by_key = _microbatch_records(ranges)
    for step, (prec, size, repeat) in measured:
        for rec in by_key[(prec, step)]:
            tokens = int(rec.attrs["tokens"])
            seconds = rec.dur_ns / 1e9
            flops = fpt * tokens
            rows.append(
                {
                    "model": cfg.model,
                    "precision": prec,
                    "phase": "update",
                    "tokens_per_microbatch": size,
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
                    "padded_tokens": int(rec.attrs["padded_tokens"]),
                    "achieved_flop_per_s": flops / seconds if seconds > 0 else None,
                    "mfu": None,
                }
            )
    return to_frame(rows)


def _microbatch_records(ranges: RangeLog) -> dict[tuple[str, int], list[Any]]:
    out: dict[tuple[str, int], list[Any]] = {}
    for r in ranges.records:
        if r.name == "update/microbatch":
            out.setdefault((str(r.attrs["precision"]), int(r.attrs["step"])), []).append(r)
    return out


EXTRA_COLUMNS = {"padded_tokens": "int64", "achieved_flop_per_s": "Float64", "mfu": "Float64"}


def to_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Rows -> the ``microbatches.parquet`` table: the shared contract columns, then the extras."""
    from tracing.outputs.schema import MICROBATCH_COLUMNS

    cols = {**MICROBATCH_COLUMNS, **EXTRA_COLUMNS}
    df = pd.DataFrame(list(rows), columns=list(cols))
    for c, t in cols.items():
        if t == "Float64":
            df[c] = pd.array([None if v is None or pd.isna(v) else float(v) for v in df[c]], dtype="Float64")
    return df.astype(cols)


def fill_gpu_columns(df: pd.DataFrame, trace_path: str) -> tuple[pd.DataFrame, str]:
    """GPU busy / host stall per micro-batch from the trace of the sweep (:func:`gpu_columns`); returns the
    table and the reason when they stay null."""
    if not torch.cuda.is_available():
        return df, NO_GPU_REASON
    from tracing.ingest.detect import load_trace

    return gpu_columns(df, load_trace(trace_path))


def gpu_columns(df: pd.DataFrame, trace: Any) -> tuple[pd.DataFrame, str]:
    """Fill ``gpu_busy_seconds`` / ``host_stall_seconds`` from a trace's ``update/microbatch`` ranges (pure).

    Rows match on (precision, learner step, micro-batch index), which the traced range names carry
    (``RangeLog(encode_attrs=True)``, as a traced sweep records them). Busy is the union of the GPU work
    launched in the range's window from any thread (autograd launches the backward); host stall is the
    device's launch-end-rule stall inside the window.
    """
    from tracing.analysis import attribution

    if trace.num_gpu_ops == 0:
        return df, "the trace has no GPU ops"
    ranges = attribution.attribute_ranges(trace)
    mb = ranges[ranges["name"].astype(str) == "update/microbatch"]
    busy, stall = {}, {}
    for r in mb.itertuples(index=False):
        a = json.loads(r.attrs) if r.attrs else {}
        key = (str(a.get("precision")), int(a.get("step", -1)), int(a.get("microbatch", -1)))
        busy[key], stall[key] = r.window_busy_ns, r.host_stall_ns
    keys = list(zip(df["precision"], df["step"], df["microbatch"], strict=True))
    out = df.copy()
    out["gpu_busy_seconds"] = pd.array([_seconds(busy.get(k)) for k in keys], dtype="Float64")
    out["host_stall_seconds"] = pd.array([_seconds(stall.get(k)) for k in keys], dtype="Float64")
    found = sum(k in busy for k in keys)
    if found < len(keys):
        return out, (
            f"{len(keys) - found} of {len(keys)} micro-batches have no update/microbatch range with "
            "precision, step and micro-batch in the trace"
        )
    return out, ""


def _seconds(ns: Any) -> Any:
    return pd.NA if ns is None or pd.isna(ns) else ns / 1e9
