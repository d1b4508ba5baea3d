"""The micro-batch table as the cost model reads it: validated contract columns plus the extras it uses.

Every column of ``tracing.outputs.schema.MICROBATCH_COLUMNS`` is accepted (only ``model``, ``precision``,
``tokens_per_microbatch`` or ``num_tokens``, and ``seconds`` are required; the rest get defaults). Extra
columns the fit uses: ``global_tokens`` (tokens in the step: two global batch sizes identify a per-step cost),
``seq_lens`` (sequence lengths of the micro-batch -> ``sum_sq_tokens``, attention's quadratic covariate),
``trace`` (whose micro-batches are whose) and ``overlap_seconds`` (``mxperf ingest``: how long the window
overlapped an earlier micro-batch's GPU work; material overlap means the times are not per-micro-batch
costs, and the fit refuses them). Any other column is ignored with a note, never refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np
import pandas as pd

from tracing.outputs.errors import InputError
from tracing.outputs.precisions import PRECISION_IDS
from tracing.outputs.schema import MICROBATCH_COLUMNS

REQUIRED = ("model", "precision", "tokens_per_microbatch", "seconds")
# Extra columns kept for the fit: name -> dtype. ``input`` is where the row came from (set by the loader).
FIT_EXTRAS = {
    "global_tokens": "Float64",
    "sum_sq_tokens": "Float64",
    "trace": "string",
    "input": "string",
    "overlap_seconds": "Float64",
    "seconds_basis": "string",  # mxperf ingest: host | device (the overlap refusal reads host rows only)
    "size_unit": "string",  # mxperf ingest: tokens | samples | images | unknown; the fit takes tokens only
}
USED_EXTRAS = (
    "global_tokens",
    "seq_lens",
    "sum_sq_tokens",
    "trace",
    "overlap_seconds",
    "seconds_basis",
    "size_unit",
)
FIT_COLUMNS = {**MICROBATCH_COLUMNS, **FIT_EXTRAS}
_NUMERIC = (
    "seconds",
    "tokens_per_microbatch",
    "num_tokens",
    "repeat",
    "step",
    "microbatch",
    "rank",
    "gpu_busy_seconds",
    "host_stall_seconds",
    "peak_mem_bytes",
    "flops",
    "global_tokens",
    "sum_sq_tokens",
    "overlap_seconds",
)
_INT = re.compile(r"\d+")


def ignored_columns(columns: Iterable[str]) -> list[str]:
    """Columns the fit does not read (reported in a note; never a reason to refuse the table)."""
    return [c for c in columns if c not in MICROBATCH_COLUMNS and c not in USED_EXTRAS and c != "input"]


def sum_sq_lengths(values: pd.Series) -> tuple[np.ndarray, int]:
    """Sum of squared sequence lengths per row from a ``seq_lens`` column (lists, arrays, or text such as
    ``"[512, 300]"`` / ``"512;300"``); NaN where absent. Returns the sums and the number of unreadable rows."""
    out = np.full(len(values), np.nan)
    bad = 0
    for i, v in enumerate(values.to_numpy(dtype=object)):
        if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
            continue
        if isinstance(v, str):
            lens = [int(x) for x in _INT.findall(v)]
            if not lens or re.search(r"[^\d\s,;\[\]()]", v):
                bad += 1
                continue
        else:
            try:
                lens = [int(x) for x in np.asarray(v, dtype=float).ravel()]
            except (TypeError, ValueError):
                bad += 1
                continue
        out[i] = float(np.sum(np.square(np.asarray(lens, dtype=float)))) if lens else np.nan
    return out, bad


def _check_numeric(df: pd.DataFrame, origin: str) -> None:
    for col in _NUMERIC:
        if col in df.columns and not pd.api.types.is_numeric_dtype(df[col].dtype):
            try:
                pd.to_numeric(df[col].dropna(), errors="raise")
            except (TypeError, ValueError):
                raise InputError(f"{origin}: column '{col}' has non-numeric values") from None


def _check_values(df: pd.DataFrame, origin: str) -> None:
    secs = pd.to_numeric(df["seconds"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    bad = ~np.isfinite(secs) | (secs < 0)
    if bad.any():
        raise InputError(
            f"{origin}: {int(bad.sum())} row(s) with NaN, infinite or negative 'seconds' (first at row {int(np.argmax(bad))})"
        )
    for col in ("host_stall_seconds", "gpu_busy_seconds"):
        v = pd.to_numeric(df[col], errors="coerce")
        if (v < 0).any():
            raise InputError(f"{origin}: negative '{col}' in {int((v < 0).sum())} row(s)")
    tok = pd.to_numeric(df["tokens_per_microbatch"], errors="coerce")
    if tok.isna().any() or (tok <= 0).any() or (tok != tok.round()).any():
        raise InputError(f"{origin}: 'tokens_per_microbatch' must be positive integers")
    g = pd.to_numeric(df["global_tokens"], errors="coerce")
    if (g <= 0).any():
        raise InputError(f"{origin}: 'global_tokens' must be positive where given")
    unknown = sorted(set(df["precision"].astype(str)) - set(PRECISION_IDS))
    if unknown:
        raise InputError(
            f"{origin}: unknown precision id(s) {', '.join(unknown)}; known: {', '.join(PRECISION_IDS)}"
        )
    for col in ("model", "phase"):
        if df[col].isna().any() or (df[col].astype(str).str.strip() == "").any():
            raise InputError(f"{origin}: empty '{col}' values")


def _check_units(df: pd.DataFrame, origin: str) -> None:
    """Sizes must count tokens: an ingest says what its sizes count (``size_unit``); samples, images or an
    unknown unit are refused unless the user labelled the sizes in tokens."""
    unit = df["size_unit"].astype("string").fillna("tokens")
    other = unit[unit != "tokens"]
    if len(other):
        counts = ", ".join(f"{n} {u}" for u, n in other.value_counts().items())
        raise InputError(
            f"{origin}: {len(other)} of {len(df)} micro-batch sizes are not tokens ({counts}: read from the "
            "trace's shapes, e.g. a first GEMM's rows); the cost model fits seconds per token: ingest again with "
            "--label tokens_per_microbatch=N (tokens per micro-batch) or give a size_unit column of 'tokens'"
        )


def conform_microbatches(
    df: pd.DataFrame, origin: str, source: str, notes: list[str] | None = None
) -> pd.DataFrame:
    """Validate a micro-batch table and return it with ``FIT_COLUMNS`` (defaults filled, types set).

    ``source`` fills a missing ``source`` column; ``notes`` (when given) receives one line per ignored or
    partly unreadable column. Raises InputError naming ``origin`` and the problem."""
    df = df.copy()
    df.columns = [str(c).strip() for c in df.columns]
    if "tokens_per_microbatch" not in df.columns and "num_tokens" in df.columns:
        df["tokens_per_microbatch"] = df["num_tokens"]
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(f"{origin}: missing column(s) {', '.join(missing)} (needed: {', '.join(REQUIRED)})")
    if len(df) == 0:
        raise InputError(f"{origin}: no micro-batch rows")
    notes = notes if notes is not None else []
    ignored = ignored_columns(df.columns)
    if ignored:
        notes.append(f"{origin}: column(s) {', '.join(ignored)} not used by the fit (ignored)")
    defaults = {"phase": "update", "repeat": 0, "step": 0, "microbatch": 0, "source": source, "input": origin}
    for col, default in defaults.items():
        if col not in df.columns:
            df[col] = default
    if "num_tokens" not in df.columns:
        df["num_tokens"] = df["tokens_per_microbatch"]
    for col in (
        "rank",
        "gpu_busy_seconds",
        "host_stall_seconds",
        "peak_mem_bytes",
        "flops",
        "global_tokens",
        "overlap_seconds",
        "seconds_basis",
        "size_unit",
    ):
        if col not in df.columns:
            df[col] = pd.NA
    if "seq_lens" in df.columns and "sum_sq_tokens" not in df.columns:
        df["sum_sq_tokens"], bad = sum_sq_lengths(df["seq_lens"])
        if bad:
            notes.append(f"{origin}: {bad} row(s) with unreadable 'seq_lens' (attention term left out there)")
    elif "sum_sq_tokens" not in df.columns:
        df["sum_sq_tokens"] = np.nan
    if "trace" not in df.columns:
        df["trace"] = pd.NA
    _check_numeric(df, origin)
    _check_values(df, origin)
    _check_units(df, origin)
    tok = pd.to_numeric(df["tokens_per_microbatch"], errors="coerce")
    df["num_tokens"] = pd.to_numeric(df["num_tokens"], errors="coerce").fillna(tok)
    for col in ("repeat", "step", "microbatch"):
        df[col] = pd.to_numeric(df[col], errors="coerce").fillna(0)
    for col in _NUMERIC:
        if FIT_COLUMNS.get(col) in ("Float64", "Int64"):
            df[col] = pd.to_numeric(df[col], errors="coerce")
    try:
        return df.loc[:, list(FIT_COLUMNS)].astype(FIT_COLUMNS)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{origin}: a column has the wrong type ({exc})") from None
