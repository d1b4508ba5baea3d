"""Tables of the Kernels and Diff pages, made from the documents ``mxperf kernels --json`` and ``mxperf diff
--json`` print (``perfmodel.kernels.summary.document``, ``perfmodel.kernels.diff.diff``).

Pure functions (no Streamlit, no files): each column is one field of the document in a display unit -- ns
divided by 1e6 (ms) or 1e3 (us), a share times 100 (%) -- never a number of their own, so a page's number is
the CLI's. Columns stay numbers (downloads are numbers); a figure the document lacks is empty (NaN), not 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

NAN = float("nan")

# kernel_diff.PARTS (+ outside_ns for per phase / per step) -> column
DIFF_PARTS: dict[str, str] = {
    "gemm_ns": "GEMM ms",
    "quantize_ns": "casts / quantize ms",
    "other_ns": "other kernels ms",
    "host_stall_ns": "host stall ms",
    "residual_ns": "residual ms",
    "outside_ns": "outside micro-batches ms",
}
VIEWS: dict[str, str] = {
    "size": "per micro-batch size (mean per micro-batch)",
    "phase": "per phase (mean per step)",
    "step": "per step (all phases)",
}
_DOC_KEY = {"size": "by_size", "phase": "by_phase", "step": "by_step"}


def _ms(ns: float | None) -> float:
    return NAN if ns is None else ns / 1e6


def _us(ns: float | None) -> float:
    return NAN if ns is None else ns / 1e3


def _pct(share: float | None) -> float:
    return NAN if share is None else 100 * share


def phases_of(doc: Mapping[str, Any]) -> list[str]:
    """Phases with kernel time or micro-batches in a ``mxperf kernels`` document, sorted."""
    found = set(doc.get("microbatches") or {})
    for r in [*doc.get("classes", []), *doc.get("kernels", [])]:
        found |= set(r.get("per_phase_ns") or {})
    return sorted(found)


def _kernel_columns(r: Mapping[str, Any], phases: Iterable[str], mb_phases: set[str]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "count": r["count"],
        "total ms": _ms(r["total_ns"]),
        "share of GPU busy %": _pct(r.get("share_of_busy")),
        "mean us": _us(r.get("mean_ns")),
        "max us": _us(r.get("max_ns")),
    }
    for p in phases:
        row[f"{p} ms"] = _ms((r.get("per_phase_ns") or {}).get(p, 0))
    for p in phases:
        if p in mb_phases:
            row[f"ms per {p} micro-batch"] = _ms((r.get("per_microbatch_ns") or {}).get(p))
    return row


def classes_frame(doc: Mapping[str, Any]) -> pd.DataFrame:
    """One row per kernel class: count, total ms, share of GPU busy %, mean / max us, ms per phase and per
    micro-batch of each phase (mean over that phase's micro-batches)."""
    phases, mbs = phases_of(doc), set(doc.get("microbatches") or {})
    return pd.DataFrame(
        [{"class": r["kernel_class"], **_kernel_columns(r, phases, mbs)} for r in doc.get("classes", [])]
    )


def _shapes(r: Mapping[str, Any]) -> str:
    return "; ".join(f"{s['op']} {s['shapes']} x{s['count']}" for s in r.get("shapes") or [])


def kernels_frame(doc: Mapping[str, Any]) -> pd.DataFrame:
    """The top kernels (as many as the document holds), as :func:`classes_frame` plus the GEMM shapes."""
    phases, mbs = phases_of(doc), set(doc.get("microbatches") or {})
    rows = [
        {
            "kernel": r["name"],
            "class": r["kernel_class"],
            **_kernel_columns(r, phases, mbs),
            "GEMM shapes (op, input shapes, count)": _shapes(r),
        }
        for r in doc.get("kernels", [])
    ]
    return pd.DataFrame(rows)


def class_phase_frame(doc: Mapping[str, Any]) -> pd.DataFrame:
    """Long table for the chart: ``class, phase, ms`` (kernel time outside every phase: ``(no phase)``)."""
    rows = []
    for r in doc.get("classes", []):
        per = r.get("per_phase_ns") or {}
        for p, ns in sorted(per.items()):
            rows.append({"class": r["kernel_class"], "phase": p, "ms": _ms(ns)})
        rest = r["total_ns"] - sum(per.values())
        if rest:
            rows.append({"class": r["kernel_class"], "phase": "(no phase)", "ms": _ms(rest)})
    return pd.DataFrame(rows, columns=["class", "phase", "ms"])


def comm_frames(comm: Mapping[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``mxperf kernels``' communication: (per step, rank and device; per step). Step -1: launched before
    any micro-batch (no step)."""
    per_rank = pd.DataFrame(
        [
            {
                "step": r["step"],
                "rank": r["rank"],
                "device": r["device"],
                "kernels": r["kernels"],
                "comm ms": _ms(r["comm_ns"]),
                "busy union ms": _ms(r["comm_union_ns"]),
                "overlapped ms": _ms(r["overlapped_ns"]),
                "exposed ms": _ms(r["exposed_ns"]),
                "overlap % of union": _pct(r.get("overlap_share")),
                "rank's step ms": _ms(r.get("step_ns")),
                "exposed % of step": _pct(r.get("exposed_share_of_step")),
            }
            for r in comm.get("per_rank_step", [])
        ]
    )
    per_step = pd.DataFrame(
        [
            {
                "step": s["step"],
                "ranks": s["ranks"],
                "comm ms": _ms(s["comm_ns"]),
                "exposed ms": _ms(s["exposed_ns"]),
                "slowest rank": s["slowest_rank"],
                "slowest rank's step ms": _ms(s.get("slowest_step_ns")),
                "its exposed %": _pct(s.get("slowest_exposed_share")),
            }
            for s in comm.get("per_step", [])
        ]
    )
    return per_rank, per_step


def roofline_frame(roof: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (GEMM kernel, op, shapes): B, M, N, K, count, mean us, GFLOP, MB, FLOP per byte,
    achieved and peak TFLOP/s, % of peak, compute- or memory-bound, floor us and the peak's note."""
    rows = []
    for g in roof.get("gemms", []):
        rows.append(
            {
                "kernel": g["kernel"],
                "op": g["op"],
                "precision": g["precision"],
                "B": g.get("batch"),
                "M": g.get("m"),
                "N": g.get("n"),
                "K": g.get("k"),
                "count": g["count"],
                "mean us": _us(g["mean_ns"]),
                "GFLOP": NAN if g.get("flops") is None else g["flops"] / 1e9,
                "MB": NAN if g.get("bytes") is None else g["bytes"] / 1e6,
                "FLOP per byte": NAN if g.get("intensity") is None else g["intensity"],
                "achieved TFLOP/s": NAN if g.get("achieved_flops") is None else g["achieved_flops"] / 1e12,
                "peak TFLOP/s": NAN if g.get("peak_flops") is None else g["peak_flops"] / 1e12,
                "% of peak": _pct(g.get("fraction_of_peak")),
                "bound": g.get("bound") or "",
                "floor us": _us(g.get("floor_ns")),
                "shapes": g["shapes"],
                "note": g.get("note") or g.get("peak_note") or "",
            }
        )
    return pd.DataFrame(rows)


def diff_frame(doc: Mapping[str, Any], view: str) -> pd.DataFrame:
    """The decomposition of ``mxperf diff``'s ``by_<view>`` rows: the group, A and B wall, B - A and its parts
    (ms; per phase / step with the time outside micro-batches), launches added (a count)."""
    rows = []
    for r in doc[_DOC_KEY[view]]:
        d = r["delta"]
        if view == "size":
            head = {
                "phase": r["phase"],
                "tokens": r["tokens"],
                "micro-batches A": r["n_a"],
                "micro-batches B": r["n_b"],
            }
        elif view == "phase":
            head = {"phase": r["phase"], "steps": r["steps"]}
        else:
            head = {"step": r["step"], "tokens A": r["tokens_a"], "tokens B": r["tokens_b"]}
        row = {**head, "A wall ms": _ms(r["a"]["wall_ns"]), "B wall ms": _ms(r["b"]["wall_ns"])}
        row["B - A ms"] = _ms(d["wall_ns"])
        for key, col in DIFF_PARTS.items():
            if key in d:
                row[col] = _ms(d[key])
        row["launches added"] = d["launches"]
        rows.append(row)
    return pd.DataFrame(rows)


def diff_label(row: Mapping[str, Any], view: str) -> str:
    """The x label of a row of :func:`diff_frame` in the chart."""
    if view == "size":
        return f"{row['phase']} {int(row['tokens'])}"
    if view == "phase":
        return str(row["phase"])
    return f"step {int(row['step'])}"


def only_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Kernels found on one side only (``only_a`` / ``only_b``): class, count, total ms, ms per micro-batch."""
    return pd.DataFrame(
        [
            {
                "kernel": r["name"],
                "class": r["kernel_class"],
                "count": r["count"],
                "total ms": _ms(r["total_ns"]),
                "ms per micro-batch": _ms(r.get("per_microbatch_ns")),
            }
            for r in rows
        ],
        columns=["kernel", "class", "count", "total ms", "ms per micro-batch"],
    )


def number_format(column: str) -> str | None:
    """The printf format a page shows a numeric column in (the values themselves, and downloads, keep every
    digit); None: as it is (counts, ids)."""
    if column.endswith(" ms"):
        return "%.3f"
    if (
        column.endswith(" us")
        or column.endswith(" %")
        or column.endswith("TFLOP/s")
        or column == "launches added"
    ):
        return "%.1f"
    if column in ("GFLOP", "MB"):
        return "%.2f"
    if column == "FLOP per byte":
        return "%.0f"
    return None
