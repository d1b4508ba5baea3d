"""The update phase's time outside its micro-batches (optimizer step, gradient bookkeeping) per precision:
measured from run folders' range logs, a term of the step model added once per step to the update.

Per learner step of a run folder, ``ranges.parquet`` holds an ``update`` range and its ``update/microbatch``
children (``parent_id``); the time outside them is ``update - sum(children)``: what the learner does once
per step besides the micro-batches a sweep measures (optimizer step, gradient clipping and zeroing, casts of
the weights done once per step). Per precision (the learner's), the steps of the run folders that ran it are
pooled (sorted paths: the order of the inputs never changes it) and the term is their median; its interval
is the percentile interval of the median over a bootstrap of the steps (the same draw as the step model's
measured phases). A precision whose run folders record no such ranges has no term, and the step model says
so (never a guess); when only one precision of a comparison has it, it is left out of both (a one-sided
term would move the gain by the term itself) and the comparison's notes say why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.fitting.bootstrap import median_replicates
from perfmodel.inputs.run_folder import attrs_of, read_ranges

PHASE = "update"  # the micro-batched phase whose range holds the per-step work
CHILD = "update/microbatch"
LABEL = "optimizer step"  # how the term is named in the step model's words


def outside_microbatches(ranges: pd.DataFrame) -> dict[int, float]:
    """Per learner step, seconds of each ``update`` range not inside its ``update/microbatch`` children
    (``dur - sum(child dur)``, never below 0); steps without children are left out (nothing tells the
    micro-batches apart from the rest). Ranges of several traces or ranks (an ingest): matched within
    each, and per step the slowest rank's."""
    need = {"range_id", "name", "dur_ns", "parent_id", "attrs"}
    if not need <= set(ranges.columns):
        return {}
    keys = [c for c in ("trace", "rank") if c in ranges.columns]
    kids = ranges[ranges["name"] == CHILD]
    inside = kids.groupby([*keys, "parent_id"])["dur_ns"].sum().to_dict()
    out: dict[int, float] = {}
    updates = ranges.loc[ranges["name"] == PHASE, [*keys, "range_id", "dur_ns", "attrs"]]
    for row in updates.itertuples(index=False):
        *key, rid, dur, raw = row
        kid = inside.get((*key, rid) if keys else rid)
        if kid is None:
            continue
        try:
            step = int(attrs_of(raw)["step"])
        except (TypeError, ValueError, KeyError):
            continue
        out[step] = max(out.get(step, 0.0), max(float(dur) - float(kid), 0.0) * 1e-9)
    return out


def run_outside(path: str) -> dict[int, float]:
    """:func:`outside_microbatches` of a run folder's ``ranges.parquet``; empty when it has none."""
    ranges = read_ranges(path)
    return {} if ranges is None else outside_microbatches(ranges)


@dataclass(frozen=True)
class OptimizerTerm:
    """One precision's time outside the update micro-batches per step (``samples``: seconds per step, sorted)
    or why there is none (``reason``); ``ci``: the 95 % interval of the median, set when drawn."""

    precision: str
    samples: tuple[float, ...] = ()
    runs: tuple[str, ...] = ()
    reason: str | None = None
    ci: tuple[float, float] | None = None

    @property
    def seconds(self) -> float | None:
        return float(np.median(self.samples)) if self.samples and self.reason is None else None

    def words(self) -> str:
        """How the term reads beside the update's source (report, fits.json)."""
        if self.seconds is None:
            return f"no {LABEL}: {self.reason}"
        ci = f" [95 % CI {1e3 * self.ci[0]:.1f}, {1e3 * self.ci[1]:.1f}]" if self.ci else ""
        return (
            f"+ {LABEL} {1e3 * self.seconds:.1f} ms per step{ci} (median over {len(self.samples)} steps of "
            f"{', '.join(self.runs)}: update range outside its micro-batch ranges)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "ci": list(self.ci) if self.ci else None,
            "steps": len(self.samples) if self.seconds is not None else 0,
            "runs": list(self.runs),
            "source": "update range minus its update/microbatch ranges (ranges.parquet), median per step",
            "reason": self.reason,
        }

    def draw(self, rng: np.random.Generator, b: int) -> np.ndarray:
        """(b,) bootstrap replicates of the median over the steps."""
        return median_replicates(np.asarray(self.samples, float), rng, b)


def optimizer_terms(
    runs: Sequence[Any], model: str, default_model: str, precisions: Sequence[str]
) -> dict[str, OptimizerTerm]:
    """Per precision, the pooled outside-micro-batch seconds of the run folders of ``model`` whose learner
    ran it (a run without a model is taken as ``default_model``); a one-sided term is withdrawn from both."""
    found: dict[str, tuple[list[float], list[str]]] = {}
    for r in sorted(runs, key=lambda r: r.path):
        if (r.model or default_model) != model or r.learner not in precisions:
            continue
        per_step = run_outside(r.path)
        if per_step:
            s, paths = found.setdefault(r.learner, ([], []))
            s.extend(per_step[k] for k in sorted(per_step))
            paths.append(r.path)
    out: dict[str, OptimizerTerm] = {}
    for p in precisions:
        if p in found:
            s, paths = found[p]
            out[p] = OptimizerTerm(p, tuple(sorted(s)), tuple(paths))
        else:
            out[p] = OptimizerTerm(
                p,
                reason=f"no run folder of {model} with a {p} learner records update and update/microbatch "
                "ranges (ranges.parquet): the update prediction is its micro-batches and per-step cost only",
            )
    have = [p for p in precisions if out[p].seconds is not None]
    if have and len(have) < len(precisions):
        missing = [p for p in precisions if p not in have]
        why = (
            f"measured for {', '.join(have)} only (none for {', '.join(missing)}): left out of every "
            "precision's update, since a term on one side would move the gain by itself"
        )
        out = {p: OptimizerTerm(p, out[p].samples, out[p].runs, reason=why) for p in precisions}
    return out
