"""``mxperf ranges OUT/``: the ranges of an ingest directory, grouped by name, heaviest first.

Per name: how often it ran, total wall time, GPU busy attributed by launches in its window (any thread) and
on its own thread, and the host stall inside it (launch-end rule). ``--match`` filters names by regular
expression; ``--json`` prints the table as one JSON line for scripts.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd

from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.manifest import read_manifest
from tracing.outputs.schema import PHASES

# Per-occurrence numbers group as one name: ProfilerStep#4 -> ProfilerStep#*, and the sequence ids
# `emit_nvtx` / nsys append to every op (aten::to, seq = 12, op_id = 999599 -> aten::to, seq = *, op_id = *).
_NUMBERED = re.compile(r"#\d+$")
_OP_ID = re.compile(r"((?:op_id|seq)\s*=\s*)\d+")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, metavar="OUT", help="an `mxperf ingest` output directory")
    p.add_argument("--top", type=int, default=20, help="rows to show (default 20; 0 = all)")
    p.add_argument("--match", metavar="PATTERN", help="only range names matching this regular expression")
    p.add_argument("--phase", choices=PHASES, help="only ranges of this canonical phase")
    p.add_argument("--trace", metavar="PATTERN", help="only ranges of the traces whose path matches (regex)")
    p.add_argument(
        "--by", choices=("name", "phase"), default="name", help="group by range name (default) or phase"
    )
    p.add_argument("--json", action="store_true", help="print the rows as one JSON line on stdout")


def _regex(flag: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InputError(f"{flag} {pattern!r}: not a regular expression ({exc})") from None


def summarize_ranges(
    ranges: pd.DataFrame,
    *,
    match: str | None = None,
    phase: str | None = None,
    by: str = "name",
    trace: str | None = None,
) -> pd.DataFrame:
    """Group a ranges table by (name, phase) -- ``Name#N`` counts as ``Name#*`` -- or, with ``by="phase"``, by
    phase over the outermost range of each phase: count, host wall, window time (start -> later of end and
    the end of the GPU work it launched), attributed busy, host stall (ms), stall share of the window."""
    df = ranges
    if trace and "trace" in df:
        rt = _regex("--trace", trace)
        df = df[df["trace"].astype(str).map(lambda t: rt.search(t) is not None).to_numpy(dtype=bool)]
    if by == "phase":
        df = df[_outermost_of_phase(df)]
    if match:
        rx = _regex("--match", match)
        df = df[df["name"].astype(str).map(lambda n: rx.search(n) is not None).to_numpy(dtype=bool)]
    if phase:
        df = df[df["phase"] == phase]
    names = df["name"].astype(str).str.replace(_NUMBERED, "#*", regex=True)
    df = df.assign(name=names.str.replace(_OP_ID, r"\g<1>*", regex=True))
    if by == "phase":
        df = df.assign(name=df["phase"])
    if "time_ns" not in df:  # an ingest written before the one time basis: host wall time only
        df = df.assign(time_ns=df["wall_ns"])
    g = df.groupby(["name", "phase"], observed=True, dropna=False)
    out = pd.DataFrame(
        {
            "count": g.size(),
            "wall_ms": g["wall_ns"].sum() / 1e6,
            "time_ms": g["time_ns"].sum() / 1e6,
            "window_busy_ms": g["window_busy_ns"].sum(min_count=1) / 1e6,
            "thread_busy_ms": g["thread_busy_ns"].sum(min_count=1) / 1e6,
            "host_stall_ms": g["host_stall_ns"].sum(min_count=1) / 1e6,
        }
    ).reset_index()
    # busy and stall are measured in each range's window (start -> later of end and its last GPU op's end)
    out["stall_share"] = out["host_stall_ms"] / out["time_ms"].where(out["time_ms"] > 0)
    return out.sort_values("time_ms", ascending=False, kind="stable").reset_index(drop=True)


def _outermost_of_phase(df: pd.DataFrame) -> pd.Series:
    """True for ranges with no ancestor of the same phase (so per-phase totals never count time twice)."""
    traces = df["trace"] if "trace" in df else pd.Series([""] * len(df), index=df.index)
    info = {
        (t, int(r)): (int(p), ph)
        for t, r, p, ph in zip(traces, df["range_id"], df["parent_id"], df["phase"], strict=True)
    }
    keep = []
    for t, parent, phase in zip(traces, df["parent_id"], df["phase"], strict=True):
        p, outermost = int(parent), True
        while p >= 0 and (t, p) in info:
            p, ph = info[(t, p)]
            if ph == phase:
                outermost = False
                break
        keep.append(outermost)
    return pd.Series(keep, index=df.index, dtype=bool)  # bool even when empty (else a column selection)


def render(table: pd.DataFrame) -> str:
    """A fixed-width text table (null GPU columns print as '-')."""
    if len(table) == 0:
        return "no ranges"
    cols = ["count", "wall_ms", "time_ms", "window_busy_ms", "thread_busy_ms", "host_stall_ms", "stall_share"]
    width = min(60, max(len("name"), *(len(str(n)) for n in table["name"])))
    lines = [f"{'name':<{width}}  {'phase':<8} " + " ".join(f"{c:>14}" for c in cols)]
    for r in table.itertuples(index=False):
        name = str(r.name) if len(str(r.name)) <= width else str(r.name)[: width - 1] + "…"
        vals = []
        for c in cols:
            v = getattr(r, c)
            vals.append(f"{'-':>14}" if pd.isna(v) else f"{int(v):>14d}" if c == "count" else f"{v:>14.3f}")
        lines.append(f"{name:<{width}}  {r.phase!s:<8} " + " ".join(vals))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.out.is_file():
        raise InputError(
            f"{args.out}: a file; `mxperf ranges` reads the folder `mxperf ingest` writes: "
            f"mxperf ingest {args.out} -o DIR, then mxperf ranges DIR"
        )
    manifest = read_manifest(args.out)
    if manifest["kind"] != "ingest":
        raise InputError(
            f"{args.out}: a '{manifest['kind']}' directory; `mxperf ranges` reads `mxperf ingest` output"
        )
    if manifest["status"] != "complete":
        raise InputError(
            f"{args.out}: ingest status is '{manifest['status']}', not complete; re-run mxperf ingest"
        )
    if args.top < 0:
        raise InputError(f"--top {args.top}: must be >= 0 (0 shows every row)")
    ranges = store.read_table(args.out / store.RANGES)
    table = summarize_ranges(ranges, match=args.match, phase=args.phase, by=args.by, trace=args.trace)
    sources = sorted(ranges["trace"].astype(str).unique()) if "trace" in ranges and not args.trace else []
    if len(sources) > 1:  # e.g. a run's range log and its trace: the same steps, seen twice
        print(
            f"note: ranges from {len(sources)} sources ({', '.join(Path(s).name for s in sources)}) add up in "
            "each row; --trace PATTERN picks one",
            file=sys.stderr,
        )
    if args.top:
        table = table.head(args.top)
    if args.json:
        rows = json.loads(table.to_json(orient="records"))
        print(json.dumps({"schema_version": store.SCHEMA_VERSION, "ranges": rows}, separators=(",", ":")))
    else:
        print(render(table))
    return 0
