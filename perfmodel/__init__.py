"""Cost model: fixed + per-token fits, breakeven with intervals, step-level predictions. Needs no torch.

Data flow (one public verb per module):

    inputs.load_inputs        sweep / labelled ingest / run dirs, CSV -> one micro-batch table
    fit.fit_cost_model        per (model, phase, precision): OLS + HC3, bootstrap, lack of fit, hold-out
    breakeven.find_breakeven  docs/contracts.md case table, n* = d_fixed / d_tok, Fieller + bootstrap intervals
    hoststall.host_stall_share  share of the added fixed cost that is host stall
    step.recommend            step time for a global batch, memory cap, what-if knobs
    results.analyze           -> the fits.json document (results.load_fits reads it back)
    report.render_report / plots.*   report.md and PNGs;  cli_fit: `mxperf fit`

The model and its formulas are explained in ``perfmodel.model`` and docs/cost-model.md.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["fit"]


def __getattr__(name: str) -> Any:  # lazy: ``import perfmodel.model`` stays cheap
    if name == "fit":
        return importlib.import_module("perfmodel.api").fit
    raise AttributeError(f"module 'perfmodel' has no attribute {name!r}")
