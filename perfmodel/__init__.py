"""Cost model: per-micro-batch fits (line or knee), breakeven with honest intervals, step predictions. No torch.

Data flow, one stage folder each (one public verb per module):

    inputs/load.load_inputs           sweep / ingest / run dirs, CSV, Parquet -> one micro-batch table (columns.py);
                                      ingest_steps, run_folder: per-step phase sources
    kernels/                          kernel tables, device table, roofline, bounds, kernel diff (beside the fit)
    fitting/design.build_design       units (steps), regressors the data identify (per-step, attention), sums
    fitting/outliers.screen_rows      a few wild micro-batches left out before the fit, and named
    fitting/fit_all.fit_cost_model    per (model, phase, precision): line (linear.py, CR3, Satterthwaite dof),
                                      unit bootstrap (bootstrap.py), lack of fit (lof.py), knee models (knee.py)
    breakeven/solve.find_breakeven    case table (+ undetermined), Fieller or knee-curve n*, model_ok, withheld n*
    breakeven/crossing, hoststall     the model-free crossing; the bounded host-stall share
    step/section.step_section         the step per precision (step/model.py), validation, what-ifs, recommendation
    report/results.analyze            -> the fits.json document (headline.verdict; results.load_fits reads it)
    report/markdown, plots            report.md and PNGs;  mxperf.commands.fit: `mxperf fit`
    simstudy.run / summarize          the guards on simulations with known truth (benchmarks/fit_simulations.py)

The model and its formulas: ``perfmodel.fitting.model`` and docs/cost-model.md.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["fit"]


def __getattr__(name: str) -> Any:  # lazy: ``import perfmodel.fitting.model`` stays cheap
    if name == "fit":
        return importlib.import_module("perfmodel.api").fit
    raise AttributeError(f"module 'perfmodel' has no attribute {name!r}")
