"""One ``mxperf run`` folder, or any other source of per-step phase seconds, as the step model reads it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tracing.outputs import store
from tracing.outputs.errors import InputError

SAMPLER_PHASES = ("generate", "sync")  # a run's phases that run in (or for) the sampler's precision


@dataclass
class RunFolder:
    """One ``mxperf run`` folder as the step model reads it: per-step seconds of each phase, the model and
    precisions it ran, and its settings (median tokens per learner step, tokens per micro-batch)."""

    path: str
    model: str | None
    learner: str | None
    sampler: str | None
    phases: dict[str, list[float]]  # phase -> seconds per step (NaN-free)
    global_tokens: float | None
    tokens_per_microbatch: float | None
    steps: (
        pd.DataFrame
    )  # per step: step, num_microbatches, update_tokens, microbatch_tokens, step_s, <phase>_s
    fit_source: bool = False  # its micro-batches are in the fit too: comparing it with the fit is in-sample
    # per step of its own token counts (an ingest's metric logs): step, prompt_tokens, generated_tokens,
    # generate_s; None: a run folder's metrics.parquet says (perfmodel.step.generation.step_tokens)
    generation: pd.DataFrame | None = None

    def precision_of(self, phase: str) -> str | None:
        """The precision a phase of this run ran in: the sampler's for generate and sync, else the learner's."""
        return self.sampler if phase in SAMPLER_PHASES else self.learner


def read_ranges(path: str | Path) -> pd.DataFrame | None:
    """A run folder's ``ranges.parquet`` (its range log), None when it has none or it cannot be read."""
    rpath = Path(path) / store.RANGES
    if not rpath.is_file():
        return None
    try:
        ranges = store.read_table(rpath)
    except InputError:
        return None
    return ranges if {"name", "attrs"} <= set(ranges.columns) else None


def attrs_of(raw: Any) -> dict[str, Any]:
    """A range's attributes (JSON text, or a mapping); empty when they cannot be read."""
    try:
        return json.loads(raw) if isinstance(raw, str) else dict(raw or {})
    except (TypeError, ValueError):
        return {}
