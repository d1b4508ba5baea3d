"""One (model, phase, precision) group as the fits see it: independent units, regressors, sufficient sums.

**Units** (what the bootstrap resamples and the covariance clusters on): micro-batches of one step share that
step's noise, so the unit is the step -- rows with the same (input, trace, repeat, step, rank). When a step
holds micro-batches of several sizes (dynamic batching: its micro-batch indices are distinct) it stays one
unit; when the key repeats across sizes without being a step (a CSV with ``repeat`` but no ``step``), the
size label is added. With no repeat structure at all (one unit per size), single micro-batches are the units
and ``unit_kind`` says so. **Strata**: units nested in size labels with >= 2 units per label are resampled
within their label, so every size stays in every replicate (a designed experiment).

**Regressors** (a column is used only when the data identify it; ``dropped`` says why not)::

    seconds = fixed + per_token * n [+ per_step * first] [+ per_step_spread * n / N] [+ per_sq_token * sum L^2]

``first`` = micro-batch 0 of its step (where a cost paid once per step lands, e.g. a weight cast cached
across micro-batches), ``N`` = ``global_tokens`` (two global batch sizes identify a per-step cost wherever
it lands), ``sum L^2`` = sum of squared sequence lengths (attention's quadratic cost).

**Sums**: rows collapse to cells (unit x distinct regressor row, a "pattern"); per response, sparse
(unit x pattern) matrices of counts and totals plus per-unit sums of squares are all any fit needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy import sparse

UNIT_STEP = "step"
UNIT_REPEAT = "repeat within size"
UNIT_ROW = "micro-batch (no repeat or step structure: micro-batches taken as independent)"
RESPONSES = {
    "seconds": "seconds",
    "gpu_busy_seconds": "gpu_busy_seconds",
    "host_stall_seconds": "host_stall_seconds",
    "peak_mem_bytes": "peak_mem_bytes",
}
GPU_SIDE = "gpu_side_seconds"  # seconds - host_stall_seconds: wall time if the host never made the GPU wait
_MIN_UNEXPLAINED = 1e-6  # a candidate regressor needs this share of its variance not explained by the others
DENSE_MAX_CELLS = (
    200_000  # (units x patterns) up to this is a dense array: small tables skip sparse overheads
)
Matrix = sparse.csr_matrix | np.ndarray


def unit_pattern_matrix(unit: np.ndarray, pattern: np.ndarray, values: np.ndarray, g: int, p: int) -> Matrix:
    """Sum of ``values`` per (unit, pattern): dense for small designs, CSR for large ones."""
    if g * p <= DENSE_MAX_CELLS:
        out = np.zeros((g, p))
        np.add.at(out, (unit, pattern), values)
        return out
    m = sparse.csr_matrix((values, (unit, pattern)), shape=(g, p))
    m.sum_duplicates()
    return m


def scale_rows(mat: Matrix, w: np.ndarray) -> Matrix:
    return mat * w[:, None] if isinstance(mat, np.ndarray) else sparse.csr_matrix(sparse.diags(w) @ mat)


def scale_cols(mat: Matrix, v: np.ndarray) -> Matrix:
    return mat * v[None, :] if isinstance(mat, np.ndarray) else sparse.csr_matrix(mat.multiply(v[None, :]))


@dataclass(frozen=True, eq=False)
class Response:
    count: Matrix  # (units x patterns) rows with a finite value
    total: Matrix  # (units x patterns) sum of the values
    sumsq: np.ndarray  # (units,) sum of squared values
    n_rows: int
    pattern_count: np.ndarray = field(init=False)  # (patterns,) the margins, computed once
    pattern_total: np.ndarray = field(init=False)
    unit_count: np.ndarray = field(init=False)  # (units,)
    unit_total: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        for name, mat, axis in (
            ("pattern_count", self.count, 0),
            ("pattern_total", self.total, 0),
            ("unit_count", self.count, 1),
            ("unit_total", self.total, 1),
        ):
            object.__setattr__(self, name, np.asarray(mat.sum(axis=axis)).ravel())

    def unit_mean(self) -> np.ndarray:
        """(units,) mean value of each unit's rows (NaN for a unit without this response)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.unit_count > 0, self.unit_total / self.unit_count, np.nan)


@dataclass(frozen=True, eq=False)
class Design:
    names: tuple[str, ...]  # regressor names: "fixed", "per_token", then identified extras
    x: np.ndarray  # (patterns, regressors)
    tokens: np.ndarray  # (patterns,) n of each pattern
    responses: dict[str, Response]
    n_units: int
    unit_kind: str
    unit_label: np.ndarray  # (units,) size label, -1 when a unit holds several
    unit_tokens: np.ndarray  # (units,) mean tokens per micro-batch
    unit_repeat: np.ndarray  # (units,) repeat of the unit's rows (pairing key with the label)
    strata: np.ndarray | None  # (units,) stratum index, or None for unstratified resampling
    n_rows: int
    dropped: dict[str, str] = field(default_factory=dict)
    seq_len_ref: float | None = None  # median sum(L^2)/n: the effective sequence length (tokens)
    row_unit: np.ndarray | None = None  # (rows,) the unit of each row of the table it was built from
    row_pattern: np.ndarray | None = None  # (rows,) the regressor pattern of each row

    @property
    def p(self) -> int:
        return len(self.names)

    def has(self, response: str, min_share: float = 0.0) -> bool:
        r = self.responses.get(response)
        return r is not None and r.n_rows > min_share * self.n_rows and r.n_rows > 0


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    if name not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _codes(*cols: np.ndarray) -> np.ndarray:
    """0..k-1 per distinct combination of the columns (any hashable values), in order of first appearance."""
    key = np.zeros(len(cols[0]), dtype=np.int64)
    for c in cols:
        codes, uniq = pd.factorize(c, use_na_sentinel=False)
        key = pd.factorize(key * len(uniq) + codes)[0].astype(np.int64)  # re-code: never overflows
    return key


def _distinct_per(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """How many distinct ``values`` each group holds (indexed by group code 0..k-1)."""
    pairs = _codes(group, values)
    first = np.zeros(pairs.max() + 1, dtype=np.int64)
    first[pairs] = group
    return np.bincount(first, minlength=int(group.max()) + 1)


def _units(df: pd.DataFrame, label: np.ndarray) -> tuple[np.ndarray, str]:
    keys = [c for c in ("input", "trace", "repeat", "step", "rank") if c in df.columns]
    base = _codes(*(df[k].to_numpy() for k in keys))
    mb = df["microbatch"].to_numpy() if "microbatch" in df.columns else np.zeros(len(df), int)
    if (_distinct_per(base, label) == 1).all():
        unit, kind = base, UNIT_STEP
    elif _codes(base, mb).max() + 1 == len(df):
        unit, kind = base, UNIT_STEP  # one step, micro-batches of several sizes
    else:
        unit, kind = _codes(base, label), UNIT_REPEAT
    per_label = _distinct_per(_codes(label), unit)
    within_label = bool((_distinct_per(_codes(unit), label) == 1).all())  # no step spans several sizes
    if within_label and (per_label == 1).all() and len(df) > per_label.sum():
        return np.arange(len(df)), UNIT_ROW
    return unit, kind


def _strata(unit: np.ndarray, label: np.ndarray, n_units: int) -> np.ndarray | None:
    if (_distinct_per(unit, label) > 1).any():
        return None
    first = np.zeros(n_units, dtype=label.dtype)
    first[unit] = label
    size_code = _codes(first)
    if (np.bincount(size_code) < 2).any():
        return None
    return size_code


def _unexplained(x: np.ndarray, w: np.ndarray, col: np.ndarray) -> float:
    """Share of ``col``'s weighted variance not explained by the columns of ``x``."""
    sw = np.sqrt(w)
    beta, *_ = np.linalg.lstsq(x * sw[:, None], col * sw, rcond=None)
    resid = (col - x @ beta) * sw
    centered = (col - np.average(col, weights=w)) * sw
    ss = float(centered @ centered)
    return float(resid @ resid) / ss if ss > 0 else 0.0


def _regressors(df: pd.DataFrame, n: np.ndarray) -> tuple[list[str], list[np.ndarray], dict[str, str]]:
    names, cols, dropped = ["fixed", "per_token"], [np.ones_like(n), n], {}
    candidates: list[tuple[str, np.ndarray | None, str]] = []
    mb = _col(df, "microbatch")
    first = (mb == 0).astype(float)
    candidates.append(
        (
            "per_step",
            first,
            "every micro-batch is the first of its step (no micro-batch index, or one per step)",
        )
    )
    g = _col(df, "global_tokens")
    spread = n / g if np.isfinite(g).all() and len(np.unique(g)) >= 2 else None
    candidates.append(("per_step_spread", spread, "needs global_tokens with >= 2 global batch sizes"))
    s2 = _col(df, "sum_sq_tokens")
    candidates.append(("per_sq_token", s2 if np.isfinite(s2).all() else None, "sequence lengths not known"))
    for name, col, why in candidates:
        if col is None or len(np.unique(col)) < 2:
            dropped[name] = why
            continue
        scale = np.abs(col).max() or 1.0
        if _unexplained(np.stack(cols, axis=1), np.ones_like(n), col / scale) < _MIN_UNEXPLAINED:
            dropped[name] = (
                "sequence lengths are constant: attention's quadratic cost is part of the per-token cost"
                if name == "per_sq_token"
                else "not separable from the other terms in these data"
            )
            continue
        names.append(name)
        cols.append(col)
    return names, cols, dropped


def _response(unit: np.ndarray, pattern: np.ndarray, values: np.ndarray, g: int, p: int) -> Response:
    ok = np.isfinite(values)
    v = np.where(ok, values, 0.0)
    count = unit_pattern_matrix(unit, pattern, ok.astype(float), g, p)
    total = unit_pattern_matrix(unit, pattern, v, g, p)
    return Response(count, total, np.bincount(unit, weights=v * v, minlength=g), int(ok.sum()))


def build_design(df: pd.DataFrame, x_col: str = "num_tokens") -> Design:
    """The design of one (model, phase, precision) table (``perfmodel.inputs.columns.FIT_COLUMNS`` rows)."""
    label = df["tokens_per_microbatch"].to_numpy(dtype=np.int64)
    n = _col(df, x_col)
    n = np.where(np.isfinite(n) & (n > 0), n, label.astype(float))
    unit_raw, kind = _units(df, label)
    unit = _codes(unit_raw)
    g = int(unit.max()) + 1
    names, cols, dropped = _regressors(df, n)
    x_rows = np.stack(cols, axis=1)
    pattern = _codes(*x_rows.T)
    x = np.zeros((int(pattern.max()) + 1, x_rows.shape[1]))
    x[pattern] = x_rows
    # number units in the order of their first pattern: many one-row units then sit in contiguous blocks per
    # pattern, which the bootstrap sums without gathering (perfmodel.fitting.bootstrap)
    first = np.zeros(g, dtype=np.int64)
    first[unit[::-1]] = pattern[::-1]
    unit = np.argsort(np.argsort(first, kind="stable"), kind="stable")[unit]
    values = {name: _col(df, col) for name, col in RESPONSES.items()}
    values[GPU_SIDE] = values["seconds"] - values["host_stall_seconds"]
    responses = {
        name: _response(unit, pattern, v, g, len(x)) for name, v in values.items() if np.isfinite(v).any()
    }
    rows = np.bincount(unit, minlength=g)
    labels = np.full(g, -1, dtype=np.int64)
    single = _distinct_per(unit, label) == 1
    labels[unit[single[unit]]] = label[single[unit]]
    repeat = np.zeros(g)
    repeat[unit[::-1]] = _col(df, "repeat")[::-1]  # the first row's repeat
    s2 = _col(df, "sum_sq_tokens")
    ref = float(np.median(s2 / n)) if np.isfinite(s2).all() else None
    return Design(
        names=tuple(names),
        x=x,
        tokens=x[:, 1].copy(),
        responses=responses,
        n_units=g,
        unit_kind=kind,
        unit_label=labels,
        unit_tokens=np.bincount(unit, weights=n, minlength=g) / rows,
        unit_repeat=repeat,
        strata=_strata(unit, label, g),
        n_rows=len(df),
        dropped=dropped,
        seq_len_ref=ref,
        row_unit=unit,
        row_pattern=pattern,
    )


def weighted(design: Design, unit_weight: np.ndarray, only: str | None = None) -> Design:
    """The same design with every row of unit u weighted by ``unit_weight[u]`` (0 leaves the unit out): a
    weighted least-squares fit on it is WLS. ``only``: keep just that response."""
    w = np.asarray(unit_weight, dtype=float)
    responses = {
        name: Response(
            scale_rows(r.count, w),
            scale_rows(r.total, w),
            r.sumsq * unit_weight,
            int(r.unit_count[np.asarray(unit_weight) != 0].sum()),
        )
        for name, r in design.responses.items()
        if only is None or name == only
    }
    return replace(design, responses=responses)


def restrict(design: Design, keep_units: np.ndarray) -> Design:
    """The same design with only ``keep_units`` (a boolean mask over units) carrying data."""
    return weighted(design, keep_units.astype(float))
