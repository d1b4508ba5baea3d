"""``perfmodel.fit``: the notebook entry point -- micro-batch tables or output paths in, the fits.json document out."""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from perfmodel.inputs.load import FitInputs, InputSummary, check_fittable, conform_microbatches, load_inputs
from perfmodel.report.results import analyze


def fit(
    *inputs: pd.DataFrame | str | os.PathLike[str],
    baseline: str = "bf16",
    min_tokens: int = 0,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Fit the cost model to micro-batch tables (``schema.MICROBATCH_COLUMNS``) and/or paths that
    ``mxperf fit`` accepts (sweep / ingest / run folders, CSV, Parquet); returns what ``fits.json`` holds."""
    paths = [x for x in inputs if not isinstance(x, pd.DataFrame)]
    frames = [x for x in inputs if isinstance(x, pd.DataFrame)]
    loaded = load_inputs(paths) if paths else FitInputs(microbatches=pd.DataFrame())
    tables = [loaded.microbatches] if paths else []
    for i, df in enumerate(frames):
        tables.append(conform_microbatches(df, f"table {i}", "table"))
        loaded.summaries.append(InputSummary(f"table {i}", "table", len(df), "micro-batches", "-"))
    loaded.microbatches = pd.concat(tables, ignore_index=True)
    check_fittable(loaded.microbatches, baseline, min_tokens)
    return analyze(loaded, baseline=baseline, min_tokens=min_tokens, n_boot=n_boot, seed=seed)
