"""One ``mxperf run`` folder, or any other source of per-step phase seconds, as the step model reads it."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

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

    def precision_of(self, phase: str) -> str | None:
        """The precision a phase of this run ran in: the sampler's for generate and sync, else the learner's."""
        return self.sampler if phase in SAMPLER_PHASES else self.learner
