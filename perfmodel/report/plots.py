"""Static PNG figures for report.md, drawn with matplotlib's Agg backend from one fits.json entry.

Each function takes a fits.json model entry (a plain dict, so the same code serves a fresh fit and a loaded
one) and returns a Figure; the CLI decides the file name. Nothing here reads or writes files. The curves
drawn are the models the data chose (a line with its 95 % band, or the knee model); the measured crossing is
the shaded pair of sizes, n* the dashed line with its interval.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from perfmodel.fitting.model import Curve, fit_band
from perfmodel.report.results import entry_stem
from perfmodel.step.costs import StepCost

COLORS = {"bf16": "#1f77b4"}
LOW_COLOR = "#d62728"


def _color(prec: str, baseline: str) -> str:
    return COLORS["bf16"] if prec == baseline else LOW_COLOR


plot_stem = entry_stem


def _grid(entry: dict[str, Any], key: str = "breakeven") -> np.ndarray:
    sizes = [s for f in entry["fits"].values() for s in f.get("sizes") or []]
    lo, hi = (min(sizes), max(sizes)) if sizes else (1.0, 1.0)
    n_star = (entry.get(key) or {}).get("tokens")
    if n_star is not None and n_star > 0:
        lo, hi = min(lo, n_star * 0.8), max(hi, n_star * 1.2)
    return np.geomspace(max(lo * 0.8, 1.0), hi * 1.1, 300)


def _emulated(entry: dict[str, Any]) -> str:
    """A title line naming emulated precisions (their timings are the emulation's, not hardware GEMMs')."""
    em = entry.get("emulated") or {}
    if not em:
        return ""
    cpu = all("cpu" in str(w).lower() for w in em.values())
    return f"\n{' and '.join(em)} {'CPU-' if cpu else ''}emulated: not hardware {' / '.join(em)} GEMMs"


def curve_of(fit: dict[str, Any]) -> Curve:
    """The micro-batch curve of a fits.json basis entry: the knee model when the data chose it, else the line
    (per-token at the reference sequence length when an attention term was fitted)."""
    knee = fit.get("knee")
    if fit.get("model") in ("knee", "parts") and knee:
        return Curve.from_dict(knee)
    att = fit.get("attention") or {}
    slope = att.get("per_token_eff_s") if att.get("per_token_eff_s") is not None else fit["per_token_s"]
    return Curve.line(float(fit["fixed_s"]), float(slope))


def _band(ax: Axes, fit: dict[str, Any], ns: np.ndarray, color: str) -> None:
    if fit.get("model") in ("knee", "parts"):
        return
    att = fit.get("attention") or {}
    line = (
        {
            "fixed_s": fit["fixed_s"],
            "per_token_s": att["per_token_eff_s"],
            "cov": att["cov_eff"],
            "dof": fit.get("dof"),
        }
        if att.get("cov_eff") is not None
        else fit
    )
    if line.get("cov") is not None and None not in np.ravel(line["cov"]):
        _, lo, hi = fit_band(line, ns)
        ax.fill_between(ns, lo, hi, color=color, alpha=0.18, linewidth=0)


def _breakeven_marks(ax: Axes, be: dict[str, Any] | None, ns: np.ndarray, label: str) -> None:
    if not be:
        return
    cross = be.get("crossing")
    if cross:
        ax.axvspan(
            cross[0],
            cross[1],
            color="#2ca02c",
            alpha=0.10,
            label=f"measured crossing {cross[0]:,.0f}-{cross[1]:,.0f}",
        )
    if be.get("tokens") is not None:
        ax.axvline(be["tokens"], color="k", ls="--", lw=1, label=f"{label} = {be['tokens']:,.0f}")
        lo, hi = be.get("ci") or (None, None)
        if lo is not None or hi is not None:
            ax.axvspan(
                lo if lo is not None else ns[0], hi if hi is not None else ns[-1], color="k", alpha=0.07
            )


def _basis_figure(entry: dict[str, Any], basis: str) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    key = "breakeven" if basis == "wall" else "breakeven_gpu_busy"
    ns = _grid(entry, key)
    base = entry["baseline"]
    for prec in (base, entry["precision"]):
        f = entry["fits"][prec] if basis == "wall" else entry["fits"][prec]["gpu_busy"]
        c = _color(prec, base)
        model = f.get("model") or "line (rejected)"
        ax.plot(ns, curve_of(f)(ns), color=c, label=f"{prec} {model}")
        _band(ax, f, ns, c)
        knee = f.get("knee")
        if f.get("model") in ("knee", "parts") and knee and knee.get("knee_tokens"):
            k = knee["knee_tokens"]
            ax.plot(
                [k], [curve_of(f)(k)], marker="v", color=c, ms=7, ls="none", label=f"{prec} knee {k:,.0f}"
            )
        fp = entry["fits"][prec]
        curve_key = "size_mean_curve_s" if basis == "wall" else "busy_size_mean_curve_s"
        means = fp.get(curve_key) or fp.get("size_mean_s" if basis == "wall" else "busy_size_mean_s")
        if means:
            x = fp.get("size_mean_tokens") or fp["sizes"]
            out = fp.get(curve_key) and fp.get("per_step_s")
            what = "measured mean, per-step cost out" if out else "measured mean"
            ax.plot(x, means, "o", color=c, ms=4, label=f"{prec} {what}")
    be = entry.get(key) or {}
    _breakeven_marks(ax, be, ns, "n*" if basis == "wall" else "n* (GPU busy)")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokens per micro-batch")
    ax.set_ylabel("seconds per micro-batch" if basis == "wall" else "GPU busy seconds per micro-batch")
    ok = "" if be.get("model_ok", True) else ", line rejected"
    what = "" if basis == "wall" else " -- host overhead removed"
    ax.set_title(
        f"{entry['model']} / {entry['phase']}: {entry['precision']} vs {base} ({be.get('case')}{ok}){what}"
        + _emulated(entry),
        fontsize=10,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def time_vs_tokens_figure(entry: dict[str, Any]) -> Figure:
    """Seconds per micro-batch vs tokens: measured means, the chosen models (95 % band for lines, the knee
    marked), n* and its interval, the measured crossing."""
    return _basis_figure(entry, "wall")


def gpu_busy_figure(entry: dict[str, Any]) -> Figure | None:
    """The same for GPU busy time (the breakeven with host overhead removed); None without GPU data."""
    if not entry.get("breakeven_gpu_busy") or any(f.get("gpu_busy") is None for f in entry["fits"].values()):
        return None
    return _basis_figure(entry, "gpu_busy")


def host_stall_figure(entry: dict[str, Any]) -> Figure | None:
    """Host-stall fraction of micro-batch time vs tokens per precision (None without stall data)."""
    fits = entry["fits"]
    if any(f.get("host_stall") is None for f in fits.values()):
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    ns = _grid(entry)
    for prec, f in fits.items():
        c = _color(prec, entry["baseline"])
        if f.get("stall_size_mean_s"):
            x = f.get("size_mean_tokens") or f["sizes"]
            frac = np.array(f["stall_size_mean_s"], dtype=float) / np.array(f["size_mean_s"], dtype=float)
            ax.plot(x, frac, "o-", color=c, ms=4, label=f"{prec} measured")
        elif f.get("model") == "line":
            st = f["host_stall"]
            ax.plot(
                ns, (st["intercept"] + st["slope"] * ns) / curve_of(f)(ns), color=c, label=f"{prec} fitted"
            )
    share = entry.get("host_stall_share_of_added_fixed")
    title = "host-stall fraction of micro-batch time"
    if share is not None:
        title += f" (share of added fixed cost: {share:.0%})"
    title += _emulated(entry)
    ax.set_title(title, fontsize=10)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokens per micro-batch")
    ax.set_ylabel("host stall / wall")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _cost(c: dict[str, Any]) -> StepCost:
    curve = Curve.from_dict(c["curve"]) if c.get("curve") else None
    return StepCost(
        c["precision"], c["per_microbatch_s"], c["per_token_s"], c["per_step_s"], curve, c.get("moved_s", 0.0)
    )


def step_time_figure(entry: dict[str, Any], global_tokens: int | None) -> Figure | None:
    """Predicted step seconds vs micro-batch size for a global batch (chosen models, fitted per-step costs),
    with what-if curves when set; None without a global batch (none is invented)."""
    if not global_tokens:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    step = entry.get("step") or {}
    other = float(sum((step.get("other_phases_s") or {}).values()))
    ns = np.geomspace(max(min(_grid(entry)[0], global_tokens), 1.0), global_tokens, 200)
    base = entry["baseline"]
    for prec in (base, entry["precision"]):
        f = entry["fits"][prec]
        own = float(sum(((step.get("other_phases_by_precision_s") or {}).get(prec) or {}).values()))
        per_step = float(f.get("per_step_s") or 0.0) + other + own
        curve = curve_of(f)
        secs = (global_tokens / ns) * curve(ns) + per_step
        label = prec + ("" if f.get("model") else " (no model fits)")
        if f.get("per_step_s"):
            label += f", per step {float(f['per_step_s']) * 1e3:.3g} ms"
        ax.plot(ns, secs, color=_color(prec, base), label=label)
    for sb in step.get("step_breakeven") or []:
        if sb.get("global_batch_tokens") == global_tokens and sb.get("tokens"):
            ci = [v for v in sb.get("ci") or [] if v is not None]
            if len(ci) == 2:
                ax.axvspan(max(ci[0], ns[0]), min(ci[1], ns[-1]), color="0.6", alpha=0.15)
            ax.axvline(sb["tokens"], color="0.3", ls="--", lw=1, label=f"step breakeven {sb['tokens']:,.0f}")
    wi = step.get("what_if")
    if wi:
        cost = _cost(wi["costs"][entry["precision"]])
        ax.plot(
            ns,
            cost.seconds(global_tokens, ns),
            color=LOW_COLOR,
            ls="--",
            label=f"{entry['precision']} what-if",
        )
    rec = step.get("recommendation") or {}
    if rec.get("tokens_per_microbatch"):
        ax.axvline(
            rec["tokens_per_microbatch"],
            color="k",
            ls=":",
            lw=1,
            label=f"recommended: {rec['precision']} @ {rec['tokens_per_microbatch']:,}",
        )
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokens per micro-batch")
    ax.set_ylabel("predicted seconds per step")
    ax.set_title(
        f"step time for a global batch of {global_tokens:,} tokens (per-step costs included)"
        + _emulated(entry),
        fontsize=10,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def close(fig: Figure) -> None:
    plt.close(fig)
