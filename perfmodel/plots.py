"""Static PNG figures for report.md, drawn with matplotlib's Agg backend from one fits.json entry.

Each function takes a fits.json model entry (a plain dict, so the same code serves a fresh fit and a loaded
one) and returns a Figure; the CLI decides the file name. Nothing here reads or writes files.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from perfmodel.model import fit_band, predict_microbatch_seconds
from perfmodel.results import entry_stem
from perfmodel.step import StepCost

COLORS = {"bf16": "#1f77b4"}
LOW_COLOR = "#d62728"


def _color(prec: str, baseline: str) -> str:
    return COLORS["bf16"] if prec == baseline else LOW_COLOR


plot_stem = entry_stem


def _grid(entry: dict[str, Any]) -> np.ndarray:
    sizes = [s for f in entry["fits"].values() for s in f.get("sizes") or []]
    lo, hi = (min(sizes), max(sizes)) if sizes else (1.0, 1.0)
    n_star = entry["breakeven"].get("tokens")
    if n_star is not None and n_star > 0:
        lo, hi = min(lo, n_star * 0.8), max(hi, n_star * 1.2)
    return np.linspace(max(lo * 0.9, 1.0), hi * 1.05, 200)


def time_vs_tokens_figure(entry: dict[str, Any]) -> Figure:
    """Seconds per micro-batch vs tokens: measured means, both fitted lines with 95 % bands, n* and its CI."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    ns = _grid(entry)
    base = entry["baseline"]
    for prec in (base, entry["precision"]):
        f = entry["fits"][prec]
        c = _color(prec, base)
        ax.plot(ns, predict_microbatch_seconds(f, ns), color=c, label=f"{prec} fit")
        if f.get("cov") is not None and None not in np.ravel(f["cov"]):
            _, lo, hi = fit_band(f, ns)
            ax.fill_between(ns, lo, hi, color=c, alpha=0.18, linewidth=0)
        if f.get("sizes"):
            ax.plot(
                f.get("size_mean_tokens") or f["sizes"],
                f["size_mean_s"],
                "o",
                color=c,
                ms=4,
                label=f"{prec} measured (mean)",
            )
    be = entry["breakeven"]
    if be.get("tokens") is not None:
        ax.axvline(be["tokens"], color="k", ls="--", lw=1, label=f"n* = {be['tokens']:,.0f}")
        lo, hi = be["ci"]
        if lo is not None or hi is not None:
            ax.axvspan(
                lo if lo is not None else ns[0], hi if hi is not None else ns[-1], color="k", alpha=0.07
            )
    ax.set_xlabel("tokens per micro-batch")
    ax.set_ylabel("seconds per micro-batch")
    ax.set_title(f"{entry['model']} / {entry['phase']}: {entry['precision']} vs {base} ({be['case']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def host_stall_figure(entry: dict[str, Any]) -> Figure | None:
    """Host-stall fraction of micro-batch time vs tokens per precision (None without stall data)."""
    fits = entry["fits"]
    if any(f.get("host_stall") is None for f in fits.values()):
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    ns = _grid(entry)
    for prec, f in fits.items():
        c = _color(prec, entry["baseline"])
        st = f["host_stall"]
        frac = (st["intercept"] + st["slope"] * ns) / predict_microbatch_seconds(f, ns)
        ax.plot(ns, frac, color=c, label=f"{prec} fitted")
        if f.get("stall_size_mean_s"):
            ax.plot(
                f.get("size_mean_tokens") or f["sizes"],
                np.array(f["stall_size_mean_s"], dtype=float) / np.array(f["size_mean_s"]),
                "o",
                color=c,
                ms=4,
                label=f"{prec} measured",
            )
    share = entry.get("host_stall_share_of_added_fixed")
    title = "host-stall fraction of micro-batch time"
    if share is not None:
        title += f" (share of added fixed cost: {share:.0%})"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("tokens per micro-batch")
    ax.set_ylabel("host stall / wall")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def step_time_figure(entry: dict[str, Any], global_tokens: int) -> Figure:
    """Predicted step seconds vs micro-batch size for a global batch, with what-if curves when set."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    step = entry.get("step") or {}
    other = float(sum((step.get("other_phases_s") or {}).values()))
    ns = np.geomspace(max(min(_grid(entry)[0], global_tokens), 1.0), global_tokens, 200)
    base = entry["baseline"]
    for prec in (base, entry["precision"]):
        f = entry["fits"][prec]
        cost = StepCost(prec, f["fixed_s"], f["per_token_s"], other)
        ax.plot(ns, cost.seconds(global_tokens, ns), color=_color(prec, base), label=prec)
    wi = step.get("what_if")
    if wi:
        c = wi["costs"][entry["precision"]]
        cost = StepCost(c["precision"], c["per_microbatch_s"], c["per_token_s"], c["per_step_s"])
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
    ax.set_title(f"step time for a global batch of {global_tokens:,} tokens")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def close(fig: Figure) -> None:
    plt.close(fig)
