"""What-if "the same trace on device Y": each micro-batch's GPU-bound parts scaled by the two devices' bounds,
the parts no bound scales (host, communication) kept, and the breakeven on Y as a range with its assumptions.

Per micro-batch of each side (``perfmodel.kernels.diff``'s identity: wall = GEMM + quantize + other + host
stall + residual), on Y:

- GEMM kernels: each kernel's time x peak_X / peak_Y of the precision family its name states (an unknown
  family at the BF16 ratio, said); a family without a peak on either device stops the what-if (never
  guessed);
- quantize / cast kernels: x bandwidth_X / bandwidth_Y (memory-bound);
- communication kernels: kept (the interconnect is not in devices.toml);
- other kernels (attention, norms, elementwise, copies): between x bandwidth ratio and x BF16 ratio -- their
  bound is not known, so the two ratios give the ends of the range;
- host stall and residual: kept (host-side, or GPU idle the bounds do not explain). A faster GPU waits
  longer for the same host: the slow end of the range also never lets a micro-batch's time drop below its
  host window (``host_seconds`` of the ingest, when it has the column).

A straight line fixed + per_token x n per side and phase (least squares over the micro-batches, HC3
covariance: ``perfmodel.fitting.linear.fit_line``) gives d_fixed = fixed_B - fixed_A, d_tok = per_token_A -
per_token_B and n* = d_fixed / d_tok at each end (and on X itself, the reference), so the range is the two
ends' n*. Each end's case, n* and 95 % interval come from the cost model's line breakeven
(``perfmodel.breakeven.solve``: the docs/contracts.md case table, Fieller's interval of d_fixed / d_tok): sampling
noise of the traced micro-batches, not of the scaling. The scaling assumptions are not random; their two
ends bracket them, so the range's interval (``range_ci``) runs from the lower bound of one end's interval to
the upper bound of the other's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.breakeven.solve import _line_breakeven
from perfmodel.fitting.linear import fit_line
from perfmodel.fitting.model import LEVEL, LineFit
from perfmodel.kernels.devices import Device, device
from perfmodel.kernels.diff import diff, microbatch_parts
from perfmodel.kernels.ops import open_ops
from tracing.outputs.errors import InputError

ASSUMPTIONS = (
    "GEMMs keep their fraction of peak on Y (time x peak_X / peak_Y of their precision)",
    "quantize / cast kernels are memory-bound (time x bandwidth_X / bandwidth_Y)",
    "other kernels (attention, elementwise, copies) lie between memory- and compute-bound: the range's ends",
    "host stall, residual and communication kernels are not scaled (host, interconnect: not in devices.toml)",
    "the slow end keeps each micro-batch at least as long as its host window (host-bound on a faster GPU)",
    "n* from least-squares lines over the micro-batches' walls (tokens_per_microbatch), case and 95 % "
    "interval as mxperf fit's line breakeven (HC3, Fieller): the interval is the micro-batches' noise, the "
    "range's interval joins the two ends' intervals; no lack-of-fit or overlapping-window checks (mxperf fit "
    "has them)",
)


def source_device(out: str | Path) -> Device | None:
    """The device the ingest's traces name (``gpu_names`` in its manifest), or None when none is known."""
    try:
        manifest = json.loads((Path(out) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    names = {n for t in manifest.get("traces") or [] for n in (t.get("gpu_names") or [])}
    for n in sorted(names):
        try:
            return device(n)
        except InputError:
            continue
    return None


def _ratio(src: Device, dst: Device, family: str) -> float:
    ps, why_s = src.peak_flops(family)
    pd, why_d = dst.peak_flops(family)
    if not ps or not pd:
        who = src if not ps else dst
        why = why_s if not ps else why_d
        raise InputError(
            f"{family} GEMMs cannot be scaled from {src.id} to {dst.id}: {who.id} has no peak ({why})"
        )
    return ps / pd


def scaled_microbatches(out: str | Path, src: Device, dst: Device) -> list[dict[str, Any]]:
    """One row per micro-batch of the ingest ``out``: its measured parts and its wall on ``dst`` at the fast
    and slow ends (``wall_fast_ns`` / ``wall_slow_ns``; ``wall_src_ns`` = the measured wall)."""
    from tracing.analysis.precision import gemm_precision

    bw_s, bw_d = src.hbm_bytes_per_s, dst.hbm_bytes_per_s
    if not bw_s or not bw_d:
        raise InputError(f"no HBM bandwidth for {src.id if not bw_s else dst.id} in devices.toml")
    r_bw = bw_s / bw_d
    r_bf16 = _ratio(src, dst, "bf16")
    with open_ops(out) as con:
        parts = microbatch_parts(con)
        gemm = con.execute(
            "select mb_id, name, sum(dur_ns)::bigint from ops where kernel_class = 'gemm' and mb_id is not null "
            "group by all"
        ).fetchall()
        comm = dict(
            con.execute(
                "select mb_id, sum(dur_ns)::bigint from ops where kernel_class = 'communication' "
                "and mb_id is not null group by all"
            ).fetchall()
        )
        cols = {r[0] for r in con.execute("describe mb").fetchall()}
        host = (
            dict(con.execute("select mb_id, round(host_seconds * 1e9)::bigint from mb").fetchall())
            if "host_seconds" in cols
            else {}
        )
    ratios: dict[str, float] = {}
    unknown = False
    gemm_y: dict[int, float] = {}
    for mb_id, name, ns in gemm:
        fam = gemm_precision(name)
        if fam not in ratios:
            if fam == "unknown":
                unknown = True
                ratios[fam] = r_bf16
            else:
                ratios[fam] = _ratio(src, dst, fam)
        gemm_y[mb_id] = gemm_y.get(mb_id, 0.0) + ns * ratios[fam]
    rows = []
    for r in parts:
        c = int(comm.get(r["mb_id"], 0) or 0)
        other = r["other_ns"] - c
        kept = r["host_stall_ns"] + r["residual_ns"] + c
        base = gemm_y.get(r["mb_id"], 0.0) + r["quantize_ns"] * r_bw + kept
        fast = base + other * min(r_bw, r_bf16)
        slow = base + other * max(r_bw, r_bf16)
        h = host.get(r["mb_id"])
        floored = h is not None and float(h) >= slow
        if h is not None:
            slow = max(slow, float(h))
        rows.append(
            {
                **r,
                "communication_ns": c,
                "kept_ns": kept,
                "wall_src_ns": float(r["wall_ns"]),
                "wall_fast_ns": fast,
                "wall_slow_ns": slow,
                "host_window": h is not None,
                # the slow end is the host window, and that spans (nearly) the whole micro-batch today: the
                # host waits for the GPU inside it, so the floor is today's time, not a host-bound bound
                "host_floor_is_wall": floored and float(h) >= 0.99 * float(r["wall_ns"]),
            }
        )
    if unknown and rows:
        rows[0].setdefault("notes", []).append("GEMMs of unknown precision scaled at the BF16 ratio")
    return rows


def _line(rows: list[dict[str, Any]], key: str) -> LineFit | None:
    """The HC3 line (s on tokens) of ``key`` (ns) over the micro-batches; None under two sizes."""
    x = np.array([float(r["tokens"]) for r in rows if r.get("tokens")])
    if len(set(x.tolist())) < 2:
        return None
    y = np.array([r[key] * 1e-9 for r in rows if r.get("tokens")])
    return fit_line(x, y, x)


def _num(v: Any) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)


def _breakeven(la: LineFit | None, lb: LineFit | None) -> dict[str, Any]:
    """B against A (the baseline) at one end: the line breakeven's case, n* and 95 % intervals."""
    if la is None or lb is None:
        return {
            "d_fixed_s": None,
            "d_tok_s": None,
            "tokens": None,
            "case": "fewer than two sizes",
            "ci": None,
            "ci_reason": "a line needs micro-batches of two sizes on each side",
        }
    none = np.empty((0, 2))
    be = _line_breakeven(la, lb, none, none, LEVEL)
    reason = be.ci_reason
    if be.case == "undetermined":
        reason = "no interval: a size with one micro-batch leaves the HC3 covariance undefined"
    return {
        "d_fixed_s": float(be.d_fixed_s),
        "d_tok_s": float(be.d_tok_s),
        "d_fixed_ci": [_num(v) for v in be.d_fixed_ci],
        "d_tok_ci": [_num(v) for v in be.d_tok_ci],
        "tokens": _num(be.tokens),
        "tokens_estimate": _num(be.tokens_estimate),
        "case": be.case,
        "ci": [_num(v) for v in be.ci],
        "ci_method": be.ci_method,
        "ci_reason": reason,
    }


def _range_ci(ends: list[dict[str, Any]]) -> list[float | None] | None:
    """From the lowest lower bound to the highest upper bound of the ends that give n* (None for an end that
    is unbounded); None when no end gives n*."""
    cis = [e["ci"] for e in ends if e["tokens"] is not None and e["ci"] is not None]
    if not cis:
        return None
    lo = None if any(c[0] is None for c in cis) else min(c[0] for c in cis)
    hi = None if any(c[1] is None for c in cis) else max(c[1] for c in cis)
    return [lo, hi]


def what_if(a: str | Path, b: str | Path, dst: Device, src: Device | None = None) -> dict[str, Any]:
    """The ``--on`` document: per phase, the breakeven measured on the source device (from the same lines) and
    on ``dst`` at the fast and slow ends, the parts not scaled (ms per micro-batch), and the assumptions."""
    if src is None:
        srcs = [source_device(a), source_device(b)]
        if srcs[0] is None or srcs[1] is None or srcs[0].id != srcs[1].id:
            raise InputError(
                "the traces name no single device of devices.toml (gpu_names): give it with --device"
            )
        src = srcs[0]
    sides = [scaled_microbatches(p, src, dst) for p in (a, b)]
    phases = sorted({str(r["phase"]) for s in sides for r in s if r.get("phase") is not None})
    out_phases = []
    for ph in phases:
        rs = [[r for r in s if str(r["phase"]) == ph and r.get("tokens")] for s in sides]
        if not rs[0] or not rs[1]:
            continue
        row: dict[str, Any] = {"phase": ph, "microbatches": [len(rs[0]), len(rs[1])]}
        for end, key in (("source", "wall_src_ns"), ("fast", "wall_fast_ns"), ("slow", "wall_slow_ns")):
            row[end] = _breakeven(_line(rs[0], key), _line(rs[1], key))
        ns = [t for t in (row["fast"]["tokens"], row["slow"]["tokens"]) if t is not None]
        row["range_tokens"] = [min(ns), max(ns)] if ns else None
        row["range_ci"] = _range_ci([row["fast"], row["slow"]])
        row["not_scaled_ms"] = {
            side: {
                k: sum(r[k] for r in s) / len(s) / 1e6
                for k in ("host_stall_ns", "communication_ns", "residual_ns")
            }
            for side, s in (("a", rs[0]), ("b", rs[1]))
        }
        row["host_window"] = all(r["host_window"] for s in rs for r in s)
        every = [r for s in rs for r in s]
        row["slow_end_is_today_share"] = sum(r["host_floor_is_wall"] for r in every) / len(every)
        out_phases.append(row)
    notes = sorted({n for s in sides for r in s for n in r.get("notes", [])})
    today = [f"{p['phase']} {100 * p['slow_end_is_today_share']:.0f} %" for p in out_phases]
    if any(p["slow_end_is_today_share"] >= 0.5 for p in out_phases):
        notes.append(
            "the slow end is today's time for most micro-batches (share per phase: "
            + ", ".join(today)
            + "): their host window spans the whole micro-batch, so the host waits for the GPU inside it and "
            "how much of that wait a faster GPU removes is not known from the trace; read the fast end as the "
            "estimate and the slow end as 'no faster than today'"
        )
    if not all(p["host_window"] for p in out_phases):
        notes.append(
            "no host_seconds in the ingest (re-ingest): the slow end does not floor at the host window"
        )
    return {
        "source": src.id,
        "target": dst.id,
        "ratios": {
            "bandwidth": src.hbm_bytes_per_s / dst.hbm_bytes_per_s,
            **{
                f: src.peak_flops(f)[0] / dst.peak_flops(f)[0]
                for f in ("bf16", "fp8", "mxfp8")
                if src.peak_flops(f)[0] and dst.peak_flops(f)[0]
            },
        },
        "phases": out_phases,
        "assumptions": list(ASSUMPTIONS),
        "notes": notes,
    }


def diff_document(
    a: str | Path, b: str | Path, dst: Device | None = None, src: Device | None = None
) -> dict[str, Any]:
    """The ``mxperf diff A B --json`` document (``perfmodel.kernels.diff.diff``) and, with ``dst``, its
    ``what_if`` on that device (checked first: a device it cannot scale to stops before the diff)."""
    whatif = what_if(a, b, dst, src) if dst is not None else None
    doc = diff(a, b)
    if whatif is not None:
        doc["what_if"] = whatif
    return doc


def render(doc: dict[str, Any]) -> list[str]:
    """Lines for ``mxperf diff --on``."""
    r = doc["ratios"]
    lines = [
        "",
        f"what-if: the same traces on {doc['target']} (measured on {doc['source']}); time ratios "
        + ", ".join(f"{k} x{v:.3f}" for k, v in r.items()),
    ]

    def n(v: dict[str, Any]) -> str:
        return "-" if v["tokens"] is None else f"{v['tokens']:,.0f}"

    def ci(c: list[float | None] | None) -> str:
        if c is None or (c[0] is None and c[1] is None):
            return "no interval"
        lo = "-inf" if c[0] is None else f"{c[0]:,.0f}"
        hi = "inf" if c[1] is None else f"{c[1]:,.0f}"
        return f"95 % [{lo}, {hi}]"

    for p in doc["phases"]:
        s = p["source"]
        rng = p["range_tokens"]
        rng_s = "none" if rng is None else f"{rng[0]:,.0f} to {rng[1]:,.0f} tokens, {ci(p['range_ci'])}"
        lines.append(
            f"{p['phase']:<9} breakeven on {doc['source']} {n(s)} ({s['case']}); on {doc['target']}: {rng_s}"
        )
        for end in ("source", "fast", "slow"):
            e = p[end]
            if e["d_fixed_s"] is None:
                lines.append(f"    {end:<6} {e['case']}")
                continue
            tail = f"; n* {n(e)} {ci(e['ci'])}" if e["tokens"] is not None else ""
            lines.append(
                f"    {end:<6} {e['case']}: fixed {e['d_fixed_s'] * 1e3:+.3f} ms, saves "
                f"{e['d_tok_s'] * 1e6:+.3f} us/token{tail}"
                + (f" ({e['ci_reason']})" if e["ci_reason"] else "")
            )
        ns = p["not_scaled_ms"]
        lines.append(
            "    not scaled (ms per micro-batch, A / B): "
            + ", ".join(
                f"{k.removesuffix('_ns').replace('_', ' ')} {ns['a'][k]:.3f} / {ns['b'][k]:.3f}"
                for k in ("host_stall_ns", "communication_ns", "residual_ns")
            )
        )
    if not doc["phases"]:
        lines.append("no phase has micro-batches of two sizes on both sides")
    lines += [f"assumption: {a}" for a in doc["assumptions"]]
    lines += [f"note: {x}" for x in doc["notes"]]
    return lines
