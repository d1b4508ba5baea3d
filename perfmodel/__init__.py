"""Cost model: per-micro-batch fits (line or knee), breakeven with honest intervals, step predictions. No torch.

Data flow (one public verb per module):

    inputs.load_inputs          sweep / ingest / run dirs, CSV, Parquet -> one micro-batch table (columns.py)
    design.build_design         units (steps), regressors the data identify (per-step, attention), sums
    outliers.screen_rows        a few wild micro-batches left out before the fit, and named
    fitting.fit_cost_model      per (model, phase, precision): line (linear.py, CR3, Satterthwaite dof),
                                unit bootstrap (bootstrap.py), lack of fit (lof.py), knee models (knee.py)
    breakeven.find_breakeven    case table (+ undetermined), Fieller or knee-curve n*, model_ok, withheld n*
    crossing.measured_crossing  the model-free crossing;  hoststall.host_stall_share  bounded share
    steplevel.step_section      step costs with per-step terms, step breakeven per global batch, what-ifs
    results.analyze             -> the fits.json document (headline.verdict; results.load_fits reads it)
    report.render_report / plots.*   report.md and PNGs;  mxperf.commands.fit: `mxperf fit`
    simstudy.run / summarize    the guards on simulations with known truth (benchmarks/fit_simulations.py)

The model and its formulas: ``perfmodel.model`` and docs/cost-model.md.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["fit"]


def __getattr__(name: str) -> Any:  # lazy: ``import perfmodel.model`` stays cheap
    if name == "fit":
        return importlib.import_module("perfmodel.api").fit
    raise AttributeError(f"module 'perfmodel' has no attribute {name!r}")
