"""Generation per precision as prefill + per-generated-token decode cost, fitted on the sources' steps, so the
step model's generate term scales with the batch and the response lengths (issue 33 item 1).

Per step of the run folders and metric-log ingests whose sampler ran precision ``p`` (pooled, sorted paths)::

    generate_s = fixed + prefill * prompt_tokens + decode * generated_tokens

``generated_tokens``: the step's ``response_tokens`` (metrics.parquet); ``prompt_tokens``: a
``prompt_tokens`` column, else the step's ``logprob`` range ``tokens`` (prompt + response, ranges.parquet)
minus its generated tokens. An ingest of a verl / NeMo RL metric log gives both from the log's own counts
(``step_tokens.parquet``), with the log's generate seconds (:mod:`perfmodel.inputs.ingest_steps`). OLS with
every step its own unit (:func:`perfmodel.fitting.linear.fit_response`: HC3 covariance, calibrated bootstrap
replicates of the three coefficients). At ``N`` tokens per step with ``G`` generated (``G`` default: ``N``
times the runs' median generated share), prompt tokens are ``N - G``.

The fit is used only when the data support it; otherwise the step model keeps the measured median (not
scaled) and says why: fewer than ``MIN_STEPS`` steps, prompt and generated tokens that do not move apart
(collinear), a bootstrap that cannot refit, or a decode cost whose 95 % interval is not above zero. A prefill
cost the steps do not resolve (its interval holds zero while decode's does not: a sampler that prefills each
distinct prompt once, or prompts of nearly one length) is dropped: the fit is ``fixed + decode *
generated_tokens``, the prompt's cost sits in the fixed part, and the output says that other prompt lengths
are not scaled. When one precision of a comparison has no usable fit, neither uses one (one side scaling and
the other held would make the gain depend on that alone).

Intervals: the pairs bootstrap over steps is re-scaled so that its replicates carry the fit's CR3 (jackknife)
covariance times ``(t(dof) / z)^2``, the same spread as the coefficients' stated t intervals. With a few dozen
steps the plain bootstrap is too narrow where a prediction leans on the extreme steps (the step gain's 95 %
interval covered the truth of 120 simulations 91 % of the time; re-scaled: 93 %,
tests/unit/test_perfmodel_step_coverage.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from perfmodel.fitting.bootstrap import draw, percentile_ci
from perfmodel.fitting.design import Response, unit_pattern_matrix
from perfmodel.fitting.linear import fit_response
from perfmodel.fitting.model import LEVEL, t_quantile
from perfmodel.inputs.run_folder import attrs_of, read_ranges
from tracing.outputs import store
from tracing.outputs.errors import InputError

PHASE = "generate"
MIN_STEPS = 8  # three coefficients and at least five degrees of freedom
_NAMES = ("fixed", "per_token", "per_generated_token")  # per_token: the prefill cost per prompt token


def step_tokens(path: str) -> pd.DataFrame:
    """Per step of a run folder: ``step``, ``prompt_tokens``, ``generated_tokens``, ``generate_s`` (rows
    where any is missing left out); empty when the folder does not record them."""
    cols = ["step", "prompt_tokens", "generated_tokens", "generate_s"]
    empty = pd.DataFrame(columns=cols, dtype=float)
    mpath = Path(path) / store.METRICS
    try:
        m = store.read_table(mpath) if mpath.is_file() else None
    except InputError:
        m = None
    if m is None or "generate_s" not in m.columns or "response_tokens" not in m.columns:
        return empty
    step = pd.to_numeric(m.get("step", pd.Series(range(len(m)), index=m.index)), errors="coerce")
    gen = pd.to_numeric(m["response_tokens"], errors="coerce")
    if "prompt_tokens" in m.columns:
        prompt = pd.to_numeric(m["prompt_tokens"], errors="coerce")
    else:
        total = _logprob_tokens(path)
        prompt = pd.Series(
            [total.get(int(s), np.nan) if pd.notna(s) else np.nan for s in step], index=m.index
        )
        prompt = prompt - gen
    out = pd.DataFrame(
        {
            "step": step,
            "prompt_tokens": prompt,
            "generated_tokens": gen,
            "generate_s": pd.to_numeric(m["generate_s"], errors="coerce"),
        }
    )
    return _usable(out)


def run_step_tokens(run: Any) -> pd.DataFrame:
    """:func:`step_tokens` of a source: the rows it carries (``generation``: an ingest's metric logs), else
    its run folder's."""
    rows = getattr(run, "generation", None)
    return _usable(rows) if rows is not None else step_tokens(run.path)


def _usable(out: pd.DataFrame) -> pd.DataFrame:
    """The rows with every number finite and no negative token count."""
    ok = (
        np.isfinite(out.to_numpy(float)).all(axis=1)
        & (out["prompt_tokens"] >= 0)
        & (out["generated_tokens"] >= 0)
    )
    return out[ok].reset_index(drop=True)


def _logprob_tokens(path: str) -> dict[int, float]:
    """Per step, the ``tokens`` of its ``logprob`` range (prompt + response tokens the learner scored)."""
    r = read_ranges(path)
    if r is None:
        return {}
    out: dict[int, float] = {}
    for raw in r.loc[r["name"] == "logprob", "attrs"]:
        a = attrs_of(raw)
        try:
            out[int(a["step"])] = float(a["tokens"])
        except (TypeError, ValueError, KeyError):
            continue
    return out


@dataclass(frozen=True, eq=False)
class GenerationFit:
    """One precision's generation fit (``reason`` None: used) over ``steps`` steps of ``runs``."""

    precision: str
    steps: int = 0
    runs: tuple[str, ...] = ()
    beta: tuple[float, float, float] | None = None  # fixed, prefill per prompt token, decode per token
    ci: tuple[tuple[float, float], ...] | None = None  # 95 % interval of each coefficient
    boot: np.ndarray = field(default_factory=lambda: np.empty((0, 3)))  # (B, 3) replicates
    generated_share: float | None = None  # median generated / (prompt + generated) over the steps
    reason: str | None = None
    note: str | None = None  # a used fit's caveat (prefill not resolved: in the fixed part)

    @property
    def used(self) -> bool:
        return self.reason is None and self.beta is not None

    def tokens(self, big_n: float, generated: float | None) -> tuple[float, float]:
        """(prompt, generated) tokens at ``N`` tokens per step."""
        g = float(generated) if generated is not None else big_n * float(self.generated_share or 0.0)
        return max(big_n - g, 0.0), g

    def seconds(self, big_n: float, generated: float | None = None) -> float:
        p, g = self.tokens(big_n, generated)
        f, a, d = self.beta  # type: ignore[misc]
        return float(f + a * p + d * g)

    def replicates(self, boot: np.ndarray, big_n: float, generated: float | None = None) -> np.ndarray:
        p, g = self.tokens(big_n, generated)
        return boot @ np.array([1.0, p, g])

    def as_dict(self) -> dict[str, Any]:
        coef = dict(
            zip(("fixed_s", "prefill_per_token_s", "decode_per_token_s"), self.beta or (), strict=False)
        )
        ci = dict(
            zip(("fixed_ci", "prefill_per_token_ci", "decode_per_token_ci"), self.ci or (), strict=False)
        )
        return {
            "used": self.used,
            "model": "fixed + prefill_per_token * prompt_tokens + decode_per_token * generated_tokens",
            **{k: float(v) for k, v in coef.items()},
            **{k: [float(v[0]), float(v[1])] for k, v in ci.items()},
            "steps": self.steps,
            "runs": list(self.runs),
            "generated_share": self.generated_share,
            "reason": self.reason,
            "note": self.note,
        }

    def words(self) -> str:
        if self.used:
            f, a, d = self.beta  # type: ignore[misc]
            return (
                f"fit over {self.steps} steps of {', '.join(self.runs)}: {1e3 * f:.3g} ms + {1e6 * a:.3g} us per "
                f"prompt token + {1e6 * d:.3g} us per generated token (scaled to N; generated share "
                f"{self.generated_share:.2f} unless given)" + (f"; {self.note}" if self.note else "")
            )
        return f"held at the measured median, not scaled with N: {self.reason}"


def _ols(table: pd.DataFrame, seed: int, n_boot: int, prefill: bool = True) -> tuple[Any, str | None]:
    """The OLS of generate_s on [1, prompt, generated] (``prefill`` False: on [1, generated]), or why it cannot
    be used; its replicates carry the CR3 covariance (:func:`_cr3_replicates`)."""
    k = len(table)
    cols = [np.ones(k), *([table["prompt_tokens"]] if prefill else []), table["generated_tokens"]]
    names = _NAMES if prefill else ("fixed", "per_token")  # without prefill, per_token is the decode cost
    x = np.column_stack(cols).astype(float)
    y = table["generate_s"].to_numpy(float)
    unit = np.arange(k)
    resp = Response(
        unit_pattern_matrix(unit, unit, np.ones(k), k, k), unit_pattern_matrix(unit, unit, y, k, k), y * y, k
    )
    draws = draw(k, None, n_boot, np.random.default_rng([seed, 33, 7])) if n_boot else None
    fit = fit_response(x, names, resp, draws)
    if fit is None or fit.names != names:
        return None, (
            "prompt and generated tokens do not move apart across the steps (collinear with each other or "
            "constant): prefill and decode costs cannot be told apart"
            if prefill
            else "the generated tokens do not move across the steps: no decode cost"
        )
    if fit.boot_note or not len(fit.boot):
        return None, f"no bootstrap of the fit ({fit.boot_note or 'no replicates asked for'})"
    return fit, None


def _cr3_replicates(fit: Any) -> np.ndarray:
    """(B, p) replicates about the estimate with the CR3 covariance times (t / z)^2 (the plain bootstrap's
    shape, re-scaled by ``L_cr3 L_boot^-1``); the calibrated bootstrap where either covariance is singular."""
    raw = np.asarray(fit.boot_raw, float)
    centred = raw - raw.mean(axis=0)
    try:
        l_boot = np.linalg.cholesky(np.cov(centred, rowvar=False))
        l_cr3 = np.linalg.cholesky(np.asarray(fit.cov, float))
    except np.linalg.LinAlgError:
        return np.asarray(fit.boot, float)
    tz = t_quantile(LEVEL, fit.dof) / float(stats.norm.ppf(0.5 + LEVEL / 2.0))
    if not np.isfinite(tz):
        return np.asarray(fit.boot, float)
    return np.asarray(fit.beta, float) + tz * centred @ np.linalg.solve(l_boot.T, l_cr3.T)


def fit_generation(precision: str, runs: Sequence[Any], seed: int = 0, n_boot: int = 1000) -> GenerationFit:
    """The generation fit of ``precision`` over the steps of ``runs`` (its sampler's run folders)."""
    ordered = sorted(runs, key=lambda r: r.path)
    tables = [run_step_tokens(r) for r in ordered]
    used = tuple(r.path for r, t in zip(ordered, tables, strict=True) if len(t))
    table = pd.concat([t for t in tables if len(t)], ignore_index=True) if used else pd.DataFrame()
    steps = len(table)
    if not steps:
        return GenerationFit(
            precision,
            reason="no run folder or metric log records per-step prompt and generated tokens (metrics "
            "response_tokens and logprob ranges' tokens; a verl / NeMo RL log's token counts, "
            "step_tokens.parquet)",
        )
    total = table["prompt_tokens"] + table["generated_tokens"]
    share = float(np.median(table["generated_tokens"] / total.where(total > 0)))
    if steps < MIN_STEPS:
        why = f"{steps} steps are too few for a fixed, a prefill and a decode cost (at least {MIN_STEPS})"
        return GenerationFit(precision, steps, used, generated_share=share, reason=why)
    fit, why = _ols(table, seed, n_boot)
    if fit is None:
        return GenerationFit(precision, steps, used, generated_share=share, reason=why)
    boot = _cr3_replicates(fit)
    ci = tuple(percentile_ci(boot[:, j]) for j in range(3))
    beta = (fit.coef("fixed"), fit.coef("per_token"), fit.coef("per_generated_token"))
    if not ci[2][0] > 0:
        why = f"the {steps} steps do not resolve a positive decode cost (95 % CI [{ci[2][0]:.3g}, {ci[2][1]:.3g}] s)"
        return GenerationFit(precision, steps, used, beta, ci, boot, share, why)
    if ci[1][0] > 0:
        return GenerationFit(precision, steps, used, beta, ci, boot, share)
    reduced, _ = _ols(table, seed, n_boot, prefill=False)
    r_boot = _cr3_replicates(reduced) if reduced is not None else None
    if r_boot is None or not percentile_ci(r_boot[:, 1])[0] > 0:
        why = f"the {steps} steps do not resolve a positive decode cost without the prefill term"
        return GenerationFit(precision, steps, used, beta, ci, boot, share, why)
    note = (
        f"no positive prefill cost resolved (95 % CI [{ci[1][0]:.3g}, {ci[1][1]:.3g}] s per prompt token): fitted as fixed + "
        "decode, the prompt's cost in the fixed part, not scaled with prompt length"
    )
    r3 = np.column_stack([r_boot[:, 0], np.zeros(len(r_boot)), r_boot[:, 1]])
    r_beta = (reduced.coef("fixed"), 0.0, reduced.coef("per_token"))
    r_ci = (percentile_ci(r3[:, 0]), ci[1], percentile_ci(r3[:, 2]))
    return GenerationFit(precision, steps, used, r_beta, r_ci, r3, share, note=note)


def generation_fits(
    runs: Sequence[Any], model: str, default_model: str, precisions: Sequence[str], seed: int, n_boot: int
) -> dict[str, GenerationFit]:
    """Per precision its fit over the run folders of ``model`` whose sampler ran it; when one precision has
    no usable fit, none is used (each keeps its coefficients and says why)."""
    out = {
        p: fit_generation(
            p, [r for r in runs if (r.model or default_model) == model and r.sampler == p], seed, n_boot
        )
        for p in precisions
    }
    unusable = [p for p in precisions if not out[p].used]
    if unusable and len(unusable) < len(precisions):
        why = (
            f"no usable generation fit for {', '.join(unusable)} "
            f"({'; '.join(str(out[p].reason) for p in unusable)}): every precision held at its measured median"
        )
        out = {
            p: GenerationFit(p, f.steps, f.runs, f.beta, f.ci, f.boot, f.generated_share, f.reason or why)
            for p, f in out.items()
        }
    return out
