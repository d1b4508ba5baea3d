"""From a micro-batch table to the ``fits.json`` document (docs/contracts.md shape plus extra keys), and back.

``analyze`` is pure: it fits every (model, phase, precision), compares each low precision with the baseline
(breakeven, host-stall share), predicts step times and applies what-if knobs, and returns a JSON-ready dict.
``load_fits`` reads and validates a ``fits.json`` for the report and the dashboard.

Per entry, beyond docs/contracts.md: ``verdict`` (one sentence), ``breakeven`` extras (``tokens_estimate``, ``ci_shape``,
``ci_excluded``, ``bootstrap_ci``, ``d_fixed_s``/``d_tok_s`` with CIs, ``measured_tokens``), per-precision
extras (``cov``, ``dof``, bootstrap CIs, ``lack_of_fit``, ``holdout``, size means, ``host_stall`` and
``memory`` lines), ``host_stall`` details and ``step`` (recommendation and what-if).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from perfmodel.bootstrap import percentile_ci
from perfmodel.breakeven import Breakeven, find_breakeven
from perfmodel.fit import fit_cost_model
from perfmodel.hoststall import HostStallShare, host_stall_share
from perfmodel.inputs import FitInputs
from perfmodel.model import LineFit, PrecisionFit
from perfmodel.paired import PairedBreakeven, paired_breakeven
from perfmodel.step import (
    WhatIf,
    default_global_tokens,
    recommend,
    step_breakeven,
    step_costs,
    weight_quant_seconds,
)
from tracing.outputs import store
from tracing.outputs.errors import InputError

SCHEMA_VERSION = 1


def _num(x: Any) -> Any:
    """JSON-safe: numpy scalars to Python, NaN/inf to None, tuples to lists (recursively)."""
    if isinstance(x, dict):
        return {k: _num(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_num(v) for v in x]
    if isinstance(x, np.ndarray):
        return _num(x.tolist())
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, float | np.floating):
        return float(x) if math.isfinite(x) else None
    return x


def _line(fit: LineFit | None) -> dict[str, Any] | None:
    if fit is None:
        return None
    return {
        "intercept": fit.intercept,
        "slope": fit.slope,
        "intercept_ci": fit.ci("intercept"),
        "slope_ci": fit.ci("slope"),
        "r2": fit.r2,
        "n_points": fit.n_points,
        "cov": fit.cov,
    }


def implausible(
    fixed_s: float, fixed_ci: Sequence[float], per_token_s: float, per_token_ci: Sequence[float]
) -> list[str]:
    """Coefficients no machine can have: a fixed or per-token cost below zero with its whole 95 % interval.

    The line is then an artefact of the sizes measured (timings that bend, a size range too narrow, noise);
    the breakeven built on it is not to be trusted."""
    out = []
    if fixed_ci[1] < 0:
        out.append(
            f"fixed cost {fixed_s * 1e3:.3g} ms per micro-batch is below zero (95 % CI up to {fixed_ci[1] * 1e3:.3g} ms): "
            "the timings are not a straight line down to zero tokens; measure more, smaller sizes or fit above "
            "the bend (--min-tokens)"
        )
    if per_token_ci[1] < 0:
        out.append(
            f"per-token cost {per_token_s * 1e6:.3g} us is below zero (95 % CI up to {per_token_ci[1] * 1e6:.3g} us): "
            "larger micro-batches measured faster; check that the inputs are one model, precision and phase"
        )
    return out


def precision_entry(f: PrecisionFit) -> dict[str, Any]:
    """One ``fits[precision]`` object of fits.json."""
    boot = f.boot
    fixed_ci, per_token_ci = f.time.ci("intercept"), f.time.ci("slope")
    return {
        "implausible": implausible(f.fixed_s, fixed_ci, f.per_token_s, per_token_ci),
        "fixed_s": f.fixed_s,
        "per_token_s": f.per_token_s,
        "fixed_ci": fixed_ci,
        "per_token_ci": per_token_ci,
        "r2": f.time.r2,
        "n_points": f.time.n_points,
        "n_microbatches": f.n_microbatches,
        "dof": f.time.dof,
        "cov": f.time.cov,
        "fixed_boot_ci": percentile_ci(boot[:, 0]) if len(boot) else None,
        "per_token_boot_ci": percentile_ci(boot[:, 1]) if len(boot) else None,
        "bootstrap_unit": f.boot_unit,
        "residual_sd_s": f.time.residual_sd,
        "sizes": list(f.sizes),
        "size_mean_s": list(f.size_mean_s),
        "size_mean_tokens": list(f.size_mean_tokens),
        "size_count": list(f.size_count),
        "lack_of_fit": asdict(f.lack_of_fit) if f.lack_of_fit else None,
        "holdout": f.holdout,
        "host_stall": _line(f.stall),
        "stall_size_mean_s": list(f.stall_size_mean_s) if f.stall_size_mean_s else None,
        "memory": _line(f.memory),
    }


def _ms(x: float) -> str:
    """Seconds per micro-batch in ms (in s from 1000 ms on)."""
    return f"{x * 1e3:.3g} ms" if abs(x) < 1.0 else f"{x:.3g} s"


def _us(x: float) -> str:
    """Seconds per token in us/token (in ms/token from 1000 us on)."""
    return f"{x * 1e6:.3g} us/token" if abs(x) < 1e-3 else f"{x * 1e3:.3g} ms/token"


def _tok(x: float | None) -> str:
    return "unbounded" if x is None else f"{x:,.0f}"


def verdict(
    model: str,
    phase: str,
    low: str,
    base: str,
    be: Breakeven,
    share: HostStallShare,
    paired: PairedBreakeven | None = None,
) -> str:
    """'mxfp8 adds X ms fixed per micro-batch and saves Y us/token; pays off above N* tokens [CI]'."""
    fixed = f"adds {_ms(be.d_fixed_s)}" if be.d_fixed_s >= 0 else f"removes {_ms(-be.d_fixed_s)}"
    tok = f"saves {_us(be.d_tok_s)}" if be.d_tok_s >= 0 else f"costs {_us(-be.d_tok_s)} more"
    head = f"{model}/{phase}: {low} vs {base}: {low} {fixed} fixed per micro-batch and {tok}"
    ci = f"[95 % CI {_tok(be.ci[0])} to {_tok(be.ci[1])}]"
    extra = " (extrapolated beyond the measured sizes)" if be.extrapolated else ""
    tail = {
        "faster_above": f"; pays off above {_tok(be.tokens)} tokens per micro-batch {ci}{extra}",
        "faster_below": f"; faster only below {_tok(be.tokens)} tokens per micro-batch {ci}{extra}",
        "always_faster": "; faster at every micro-batch size (95 %)",
        "never_faster": "; never faster at any micro-batch size (95 %)",
        "indistinguishable": "; neither difference is significant at 95 % (indistinguishable: more repeats or "
        "sizes would tell)",
    }[be.case]
    within = ""
    if be.case not in ("faster_above", "faster_below") and be.within_measured in ("faster", "slower"):
        lo, hi = be.measured_tokens
        within = (
            f". Within the measured sizes ({lo:,.0f} to {hi:,.0f} tokens) {low} is significantly "
            f"{be.within_measured} at every size"
        )
    stall = ""
    if share.share is not None and be.case in ("faster_above", "never_faster") and be.d_fixed_s > 0:
        stall = f". Host stall is {share.share:.0%} of the added fixed cost"
    pair = ""
    if paired is not None and paired.case != be.case:
        n = f" (n* = {_tok(paired.tokens)})" if paired.tokens is not None else ""
        pair = f". Paired by repeat (drift shared by both precisions cancelled): {paired.case}{n}"
    return head + tail + within + pair + stall + "."


def _compare(base: PrecisionFit, low: PrecisionFit, model: str, phase: str, baseline: str) -> dict[str, Any]:
    be = find_breakeven(base, low)
    paired = paired_breakeven(base, low)
    share = host_stall_share(base, low)
    return {
        "model": model,
        "phase": phase,
        "baseline": baseline,
        "precision": low.precision,
        "fits": {baseline: precision_entry(base), low.precision: precision_entry(low)},
        "breakeven": {
            "case": be.case,
            "tokens": be.tokens,
            "ci": list(be.ci),
            "ci_method": be.ci_method,
            "ci_reason": be.ci_reason,
            "extrapolated": be.extrapolated,
            "tokens_estimate": be.tokens_estimate,
            "ci_shape": be.ci_shape,
            "ci_excluded": be.ci_excluded,
            "bootstrap_ci": be.bootstrap_ci,
            "bootstrap_reason": be.bootstrap_reason,
            "measured_tokens": be.measured_tokens,
            "within_measured": be.within_measured,
            "diff_at_ends_s": be.diff_at_ends_s,
            "d_fixed_s": be.d_fixed_s,
            "d_fixed_ci": be.d_fixed_ci,
            "d_tok_s": be.d_tok_s,
            "d_tok_ci": be.d_tok_ci,
            "dof": be.dof,
            "paired": asdict(paired) if paired else None,
        },
        "host_stall_share_of_added_fixed": share.share,
        "host_stall": {
            "share_ci": list(share.ci),
            "ci_method": share.ci_method,
            "bootstrap_ci": share.bootstrap_ci,
            "d_stall_fixed_s": share.d_stall_fixed_s,
            "reason": share.reason,
        },
        "verdict": verdict(model, phase, low.precision, baseline, be, share, paired),
    }


def _step_section(
    group: dict[str, PrecisionFit],
    baseline: str,
    inputs: FitInputs,
    global_tokens: int,
    mem_cap: float | None,
    knobs: WhatIf,
) -> dict[str, Any]:
    sizes = sorted({s for f in group.values() for s in f.sizes})
    memory = {p: f.memory for p, f in group.items()}
    costs = step_costs(group, baseline, inputs.other_phases_s)
    section: dict[str, Any] = {
        "other_phases_s": inputs.other_phases_s,
        "recommendation": recommend(costs, memory, global_tokens, sizes, mem_cap),
        "memory_per_token_bytes": {p: (m.slope if m else None) for p, m in memory.items()},
    }
    if knobs.active:
        wq = {}
        sources = {}
        for p, f in group.items():
            if p != baseline:
                wq[p], sources[p] = weight_quant_seconds(
                    group[baseline], f, knobs, inputs.kernels, inputs.kernel_microbatches
                )
        adj = step_costs(group, baseline, inputs.other_phases_s, knobs, wq)
        section["what_if"] = {
            "knobs": asdict(knobs),
            "weight_quant_s": wq if knobs.weight_quant == "per_step" else None,
            "weight_quant_source": sources if knobs.weight_quant == "per_step" else None,
            "step_breakeven_tokens": {
                p: step_breakeven(adj[baseline], c, global_tokens) for p, c in adj.items() if p != baseline
            },
            "recommendation": recommend(adj, memory, global_tokens, sizes, mem_cap),
            "costs": {p: asdict(c) for p, c in adj.items()},
        }
    return section


def analyze(
    inputs: FitInputs,
    *,
    baseline: str = "bf16",
    min_tokens: int = 0,
    n_boot: int = 1000,
    seed: int = 0,
    global_tokens: int | None = None,
    mem_cap_bytes: float | None = None,
    knobs: WhatIf | None = None,
) -> dict[str, Any]:
    """The fits.json document for validated inputs (see ``perfmodel.inputs.check_fittable``)."""
    knobs = knobs or WhatIf()
    mb = inputs.microbatches
    fits = fit_cost_model(mb, min_tokens=min_tokens, n_boot=n_boot, seed=seed)
    n_global = int(global_tokens) if global_tokens else default_global_tokens(mb)
    entries = []
    for (model, phase), _ in mb.groupby(["model", "phase"], sort=True):
        group = {p: f for (m, ph, p), f in fits.items() if m == model and ph == phase}
        step = _step_section(group, baseline, inputs, n_global, mem_cap_bytes, knobs)
        for prec in sorted(p for p in group if p != baseline):
            entry = _compare(group[baseline], group[prec], str(model), str(phase), baseline)
            entry["step"] = step
            entries.append(entry)
    return _num(
        {
            "schema_version": SCHEMA_VERSION,
            "models": entries,
            "baseline": baseline,
            "x_variable": "num_tokens (actual tokens per micro-batch; sizes labelled by tokens_per_microbatch)",
            "min_tokens": min_tokens,
            "global_batch_tokens": n_global,
            "bootstrap": {"resamples": n_boot, "seed": seed},
            "inputs": [asdict(s) for s in inputs.summaries],
        }
    )


REQUIRED_ENTRY_KEYS = (
    "model",
    "phase",
    "baseline",
    "precision",
    "fits",
    "breakeven",
    "host_stall_share_of_added_fixed",
)


def validate_fits(doc: dict[str, Any], origin: str = "fits.json") -> dict[str, Any]:
    """Check the docs/contracts.md shape; InputError naming the first problem."""
    if int(doc.get("schema_version", 0)) != SCHEMA_VERSION:
        raise InputError(f"{origin}: schema_version {doc.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    if not isinstance(doc.get("models"), list):
        raise InputError(f"{origin}: no 'models' list")
    for i, e in enumerate(doc["models"]):
        missing = [k for k in REQUIRED_ENTRY_KEYS if k not in e]
        if missing:
            raise InputError(f"{origin}: models[{i}] lacks {', '.join(missing)}")
        for prec in (e["baseline"], e["precision"]):
            f = e["fits"].get(prec)
            if f is None or "fixed_s" not in f or "per_token_s" not in f:
                raise InputError(f"{origin}: models[{i}].fits.{prec} lacks fixed_s/per_token_s")
        for k in ("case", "tokens", "ci", "ci_method", "ci_reason"):
            if k not in e["breakeven"]:
                raise InputError(f"{origin}: models[{i}].breakeven lacks '{k}'")
    return doc


def load_fits(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a fits.json written by ``mxperf fit`` (a directory is taken to hold fits.json)."""
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, store.FITS)
    return validate_fits(store.read_json(p), p)


def entry_stem(entry: dict[str, Any]) -> str:
    """A file-name-safe ``model_phase_precision`` stem for one entry (plot file names)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{entry['model']}_{entry['phase']}_{entry['precision']}")


def entries_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per (model, phase, precision) comparison: the headline numbers, for tables."""
    rows = []
    for e in doc["models"]:
        be = e["breakeven"]
        rows.append(
            {
                "model": e["model"],
                "phase": e["phase"],
                "precision": e["precision"],
                "case": be["case"],
                "tokens": be["tokens"],
                "ci_lo": be["ci"][0],
                "ci_hi": be["ci"][1],
                "d_fixed_s": be.get("d_fixed_s"),
                "d_tok_s": be.get("d_tok_s"),
                "host_stall_share": e["host_stall_share_of_added_fixed"],
            }
        )
    return pd.DataFrame(rows)
