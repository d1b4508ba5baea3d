"""``mxperf kernels OUT``: the top kernels and kernel classes of an ingest folder.

Per kernel and per class: count, total time, share of GPU busy, time per phase and per micro-batch on average,
the GEMM shapes the trace recorded; ``--device`` adds the roofline of every GEMM with shapes (FLOPs, bytes,
achieved FLOP/s, fraction of the device's peak, compute- or memory-bound; figures and sources in
``perfmodel/kernels/devices.toml``). ``--json`` prints one JSON line; ``--parquet FILE`` writes the class and kernel
rows as one flat table (``perfmodel.kernels.tables``; columns in docs/contracts.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from tracing.outputs import store
from tracing.outputs.errors import InputError, OutputExistsError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, metavar="OUT", help="an `mxperf ingest` output directory")
    p.add_argument("--top", type=int, default=15, help="kernels to show (0 = all)")
    p.add_argument(
        "--device",
        metavar="NAME",
        help="roofline of the GEMMs against this device (h100-sxm, h200, b200, gb200, mi300x, mi325x, mi355x)",
    )
    add_bounds_arguments(p, with_fit=True)
    p.add_argument("--json", action="store_true", help="print the tables as one JSON line on stdout")
    p.add_argument(
        "--parquet",
        type=Path,
        metavar="FILE",
        help="also write the class and kernel rows (the --top kernels) as one Parquet table",
    )
    p.add_argument("--force", action="store_true", help="replace an existing file at --parquet")


def check_parquet_target(path: Path, ingest: Path, force: bool) -> None:
    """``--parquet FILE``: a .parquet file name outside the ingest folder, new unless ``--force``."""
    if path.is_dir():
        raise OutputExistsError(
            f"{path}: is a folder; give a file name (e.g. {path / 'kernel_summary.parquet'})"
        )
    if path.suffix != ".parquet":
        raise OutputExistsError(f"{path}: the kernel summary is a Parquet table; name it .parquet")
    if path.resolve().is_relative_to(ingest.resolve()):
        raise OutputExistsError(f"{path}: inside the ingest folder {ingest}; write the summary elsewhere")
    if path.exists() and not force:
        raise OutputExistsError(f"{path}: exists; choose another --parquet or pass --force to replace it")


def add_bounds_arguments(p: argparse.ArgumentParser, *, with_fit: bool = False) -> None:
    """``--model-shape`` (and for ``kernels`` ``--fit``): the physical floors of ``perfmodel.kernels.bounds``."""
    p.add_argument(
        "--model-shape",
        metavar="SPEC",
        help="the model's shapes for the floors (with --device): qwen3-8b, a config.json, or "
        "hidden=H,layers=L,ffn=F,vocab=V,heads=Q,kv_heads=KV[,head_dim=D]",
    )
    if with_fit:
        p.add_argument(
            "--fit",
            type=Path,
            metavar="FIT",
            help="a `mxperf fit` output (or its fits.json): its fixed and per-token terms next to the floors",
        )


def bounds_setup(args: argparse.Namespace) -> tuple[Any, Any] | None:
    """(device, model shape) when ``--device`` and ``--model-shape`` are given, else None; one clear error when
    only the shape is."""
    spec = getattr(args, "model_shape", None)
    if not spec:
        return None
    if not getattr(args, "device", None):
        raise InputError("--model-shape needs --device (the peaks and bandwidth of the floors)")
    from perfmodel.kernels.bounds import model_shape
    from perfmodel.kernels.devices import device

    return device(args.device), model_shape(spec)


def bounds_lines(fits_doc: dict[str, Any], setup: tuple[Any, Any]) -> list[str]:
    """The fitted terms of a fits.json document next to the floors: one line each (``perfmodel.kernels.bounds``)."""
    from perfmodel.kernels.bounds import explain_fits

    return [line for e in explain_fits(fits_doc, *setup) for line in e["lines"]]


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        return None if math.isnan(v) or math.isinf(v) else v
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def render(doc: dict[str, Any]) -> str:
    phases = sorted(doc["microbatches"])
    lines = [
        f"GPU busy {_ms(doc['busy_ns'])} ms; {doc['ops']} GPU ops, {_ms(doc['op_ns'])} ms summed; micro-batches: "
        + (", ".join(f"{p} {n}" for p, n in doc["microbatches"].items()) or "none found"),
        "",
    ]
    mb_head = "".join(f" {('ms/mb ' + p)[:14]:>14}" for p in phases)
    head = f"{'count':>7} {'total ms':>11} {'busy %':>7} {'mean us':>9}{mb_head}"
    lines.append(f"{'class':<14} {head}")
    for r in doc["classes"]:
        lines.append(f"{r['kernel_class']:<14} {_row(r, phases)}")
    lines += ["", f"{'kernel':<60} {'class':<13} {head}"]
    for r in doc["kernels"]:
        name = r["name"] if len(r["name"]) <= 60 else r["name"][:59] + "…"
        lines.append(f"{name:<60} {r['kernel_class']:<13} {_row(r, phases)}")
        for s in r.get("shapes", []):
            lines.append(f"    {s['op']} {s['shapes']} x{s['count']}")
    lines += [f"note: {n}" for n in doc.get("notes", [])]
    if "communication" in doc:
        from perfmodel.kernels.comm import render as render_comm

        lines += render_comm(doc["communication"])
    if "roofline" in doc:
        dev = doc["roofline"]["device"]
        lines += ["", f"GEMM roofline on {dev['name']} (peaks and sources: perfmodel/kernels/devices.toml)"]
        lines.append(
            f"{'op':<14} {'B x M x N x K':<24} {'prec':<6} {'count':>6} {'mean us':>9} {'GFLOP':>9} {'MB':>8} "
            f"{'TFLOP/s':>8} {'% peak':>7} {'bound':<8} {'floor us':>9}"
        )
        for g in doc["roofline"]["gemms"]:
            if "m" not in g:
                continue
            dims = f"{g['batch']}x{g['m']}x{g['n']}x{g['k']}"
            frac = "-" if g["fraction_of_peak"] is None else f"{100 * g['fraction_of_peak']:.1f}"
            floor = "-" if g["floor_ns"] is None else f"{g['floor_ns'] / 1e3:.1f}"
            mb = "-" if g["bytes"] is None else f"{g['bytes'] / 1e6:.2f}"
            lines.append(
                f"{g['op']:<14} {dims:<24} {g['precision']:<6} {g['count']:>6} {g['mean_ns'] / 1e3:>9.1f} "
                f"{g['flops'] / 1e9:>9.2f} {mb:>8} {(g['achieved_flops'] or 0) / 1e12:>8.1f} {frac:>7} "
                f"{g['bound'] or '-':<8} {floor:>9}"
            )
        for note in doc["roofline"]["notes"]:
            lines.append(f"note: {note}")
        if "bounds" in doc:
            lines += render_bounds(doc["bounds"], dev["name"])
    return "\n".join(lines)


def _bounds(args: argparse.Namespace, setup: tuple[Any, Any]) -> dict[str, Any]:
    from perfmodel.kernels.bounds import ASSUMPTIONS, as_dict, microbatch_floors
    from perfmodel.kernels.diff import microbatch_parts
    from perfmodel.kernels.ops import open_ops

    dev, shape = setup
    with open_ops(args.out) as con:
        parts = microbatch_parts(con)
        precs = [
            r[0]
            for r in con.execute("select distinct precision from mb where precision is not null").fetchall()
        ]
    out: dict[str, Any] = {"model_shape": as_dict(shape), "assumptions": list(ASSUMPTIONS), "notes": []}
    if len(precs) == 1:
        out["precision"] = precs[0]
        out["microbatches"] = microbatch_floors(parts, dev, shape, precs[0])
    else:
        out["microbatches"] = []
        out["notes"].append(
            f"micro-batch precision {'unknown' if not precs else 'mixed: ' + ', '.join(precs)}: "
            "no per-micro-batch floors (label the ingest)"
        )
    if args.fit is not None:
        from perfmodel.kernels.bounds import explain_fits

        path = args.fit / store.FITS if args.fit.is_dir() else args.fit
        try:
            fits = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"--fit {args.fit}: cannot read {path.name} ({exc})") from None
        out["fit"] = explain_fits(fits, dev, shape)
    return out


def render_bounds(b: dict[str, Any], dev_name: str) -> list[str]:
    sh = b["model_shape"]
    lines = [
        "",
        f"floors on {dev_name} for {sh['name'] or 'the given shapes'} (h {sh['hidden']}, {sh['layers']} layers, "
        f"ffn {sh['ffn']}, vocab {sh['vocab']}, heads {sh['q_heads']}/{sh['kv_heads']} x {sh['head_dim']}); "
        f"precision {b.get('precision') or '-'}",
    ]
    if b["microbatches"]:
        lines.append(
            f"{'phase':<9} {'tokens':>7} {'n':>4} {'wall ms':>9} {'GEMM ms':>9} {'floor ms':>9} {'x floor':>8} "
            f"{'cast ms':>9} {'floor ms':>9}"
        )
        for r in b["microbatches"]:
            gf, cf = r.get("gemm_floor_ns"), r.get("cast_floor_ns")
            ratio = "-" if not gf else f"{r['gemm_ns'] / gf:.2f}"
            lines.append(
                f"{r['phase']:<9} {r['tokens']:>7} {r['microbatches']:>4} {_ms(r['wall_ns']):>9} "
                f"{_ms(r['gemm_ns']):>9} {_ms(gf):>9} {ratio:>8} {_ms(r['quantize_ns']):>9} {_ms(cf):>9}"
            )
    for e in b.get("fit") or []:
        lines += e["lines"]
    for note in b["notes"]:
        lines.append(f"note: {note}")
    lines += [f"assumption: {a}" for a in b["assumptions"]]
    return lines


def _row(r: dict[str, Any], phases: list[str]) -> str:
    share = "-" if r["share_of_busy"] is None else f"{100 * r['share_of_busy']:.1f}"
    mean = "-" if r["mean_ns"] is None else f"{r['mean_ns'] / 1e3:.1f}"
    per_mb = "".join(f" {_ms(r['per_microbatch_ns'].get(p)):>14}" for p in phases)
    return f"{r['count']:>7} {r['total_ns'] / 1e6:>11.3f} {share:>7} {mean:>9}{per_mb}"


def run(args: argparse.Namespace) -> int:
    if args.top < 0:
        raise InputError(f"--top {args.top}: must be >= 0 (0 shows every kernel)")
    if args.parquet is not None:
        check_parquet_target(args.parquet, args.out, args.force)
    elif args.force:
        raise InputError("--force replaces the file of --parquet; give --parquet FILE too")
    dev = None
    if args.device:
        from perfmodel.kernels.devices import device

        dev = device(args.device)
    from perfmodel.kernels.summary import document

    doc = document(args.out, top=min(args.top, 2**62), dev=dev)  # more than any table holds: every kernel
    setup = bounds_setup(args)
    if getattr(args, "fit", None) and setup is None:
        raise InputError("--fit needs --device and --model-shape (the floors its terms are set against)")
    if setup is not None:
        doc["bounds"] = _bounds(args, setup)
    if args.parquet is not None:
        from perfmodel.kernels.tables import write_summary

        write_summary(doc, args.parquet, source=args.out)
        print(f"wrote {args.parquet}", file=sys.stderr)
    if args.json:
        print(json.dumps(_clean({"schema_version": store.SCHEMA_VERSION, **doc}), separators=(",", ":")))
    else:
        print(render(doc))
    return 0
