"""``mxperf diff A B``: the time difference between two ingests (B - A), decomposed into GEMM kernels,
quantize / cast kernels, other kernels, host stall and an explicit residual.

Per micro-batch size, per phase and per step; launches counted; kernels found on one side only named. The
parts add up to the measured difference exactly (``perfmodel.kernels.diff``). ``--json`` prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tracing.outputs import store
from tracing.outputs.errors import InputError

VIEWS = ("size", "phase", "step")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", type=Path, metavar="A", help="the baseline `mxperf ingest` folder (e.g. BF16)")
    p.add_argument("b", type=Path, metavar="B", help="the other `mxperf ingest` folder (e.g. MXFP8)")
    p.add_argument("--by", choices=VIEWS, action="append", help="views to print (default: all three)")
    p.add_argument(
        "--on",
        metavar="DEVICE",
        help="what-if: the same traces on DEVICE (GPU-bound parts scaled by the bounds; breakeven range "
        "with 95 %% intervals)",
    )
    p.add_argument("--device", metavar="NAME", help="the device the traces ran on (default: their gpu_names)")
    p.add_argument("--json", action="store_true", help="print the decomposition as one JSON line on stdout")


COLS = ("wall_ns", "gemm_ns", "quantize_ns", "other_ns", "host_stall_ns", "residual_ns")
HEAD = ("delta ms", "gemm", "quantize", "other", "host stall", "residual")


def _cells(d: dict[str, float], outside: bool) -> str:
    cols = (*COLS, "outside_ns") if outside else COLS
    vals = " ".join(f"{d[c] / 1e6:>+10.3f}" for c in cols)
    return f"{vals} {d['launches']:>+9.1f}"


def render(doc: dict[str, Any], views: tuple[str, ...]) -> str:
    a, b = doc["a"], doc["b"]
    lines = [
        f"A {a['path']} ({a['precision'] or 'precision unknown'}, {a['microbatches']} micro-batches)",
        f"B {b['path']} ({b['precision'] or 'precision unknown'}, {b['microbatches']} micro-batches)",
        "B - A in ms (launches: GPU ops launched, a count); each row: delta = gemm + quantize + other + "
        "host stall + residual [+ outside micro-batches]",
    ]
    head = " ".join(f"{h:>10}" for h in HEAD)
    if "size" in views:
        lines += [
            "",
            "per micro-batch, matched by size (mean per micro-batch; n = A/B)",
            f"{'phase':<9} {'tokens':>7} {'n':>7} {head} {'launches':>9}",
        ]
        for r in doc["by_size"]:
            lines.append(
                f"{r['phase']:<9} {r['tokens']:>7} {str(r['n_a']) + '/' + str(r['n_b']):>7} "
                f"{_cells(r['delta'], False)}"
            )
        if not doc["by_size"]:
            lines.append("no micro-batch size found on both sides")
    if "phase" in views:
        lines += [
            "",
            "per phase (mean per step; measured phase time from steps.parquet)",
            f"{'phase':<17} {head} {'outside':>10} {'launches':>9}",
        ]
        for r in doc["by_phase"]:
            lines.append(f"{r['phase']:<17} {_cells(r['delta'], True)}")
    if "step" in views:
        lines += [
            "",
            "per step (all phases; steps matched by number)",
            f"{'step':<5} {'tokens A/B':>11} {head} {'outside':>10} {'launches':>9}",
        ]
        for r in doc["by_step"]:
            lines.append(
                f"{r['step']:<5} {str(r['tokens_a']) + '/' + str(r['tokens_b']):>11} "
                f"{_cells(r['delta'], True)}"
            )
    if doc.get("terms"):
        lines += [
            "",
            "the cost model's terms, B - A, split (least-squares lines over each side's micro-batches)",
        ]
        for t in doc["terms"]:
            fx, pt = t["fixed_ns"], t["per_token_ns"]
            lines.append(
                f"{t['phase']:<9} fixed {fx['wall_ns'] / 1e6:+.3f} ms = GEMM {fx['gemm_ns'] / 1e6:+.3f} + casts "
                f"{fx['quantize_ns'] / 1e6:+.3f} + other {fx['other_ns'] / 1e6:+.3f} + host stall "
                f"{fx['host_stall_ns'] / 1e6:+.3f} + residual {fx['residual_ns'] / 1e6:+.3f}"
            )
            lines.append(
                f"{'':<9} per token {pt['wall_ns'] / 1e3:+.4f} us = GEMM {pt['gemm_ns'] / 1e3:+.4f} + casts "
                f"{pt['quantize_ns'] / 1e3:+.4f} + other {pt['other_ns'] / 1e3:+.4f} + host stall "
                f"{pt['host_stall_ns'] / 1e3:+.4f} + residual {pt['residual_ns'] / 1e3:+.4f}"
            )
            few = (
                "; two sizes: the lines pass through them, nothing checks the fit"
                if min(t["sizes"]) < 3
                else ""
            )
            lines.append(
                f"{'':<9} (sizes A / B: {t['sizes'][0]} / {t['sizes'][1]}; no interval: see mxperf fit{few})"
            )
    for key, label in (("only_a", "A"), ("only_b", "B")):
        rows = doc[key]
        if rows:
            lines += ["", f"kernels only in {label}:"]
            for r in rows[:10]:
                per = "-" if r["per_microbatch_ns"] is None else f"{r['per_microbatch_ns'] / 1e6:.3f}"
                lines.append(
                    f"  {r['kernel_class']:<12} x{r['count']:<6} {r['total_ns'] / 1e6:>10.3f} ms "
                    f"({per} ms per micro-batch)  {r['name'][:100]}"
                )
            if len(rows) > 10:
                lines.append(f"  ... and {len(rows) - 10} more (--json lists all)")
    lines += [f"note: {n}" for n in doc.get("notes", [])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from perfmodel.breakeven.whatif import diff_document

    dst = src = None
    if args.on:
        from perfmodel.kernels.devices import device

        dst = device(args.on)
        src = device(args.device) if args.device else None
    elif args.device:
        raise InputError("--device names the traces' device for --on; give --on DEVICE too")
    doc = diff_document(args.a, args.b, dst, src)
    if args.json:
        print(json.dumps({"schema_version": store.SCHEMA_VERSION, **doc}, separators=(",", ":")))
    else:
        text = render(doc, tuple(args.by or VIEWS))
        if "what_if" in doc:
            from perfmodel.breakeven.whatif import render as render_whatif

            text += "\n" + "\n".join(render_whatif(doc["what_if"]))
        print(text)
    return 0
