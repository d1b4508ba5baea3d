"""``mxperf ranges OUT/``: the ranges of an ingest directory, grouped by name, heaviest first.

Per name: how often it ran, total wall time, GPU busy attributed by launches in its window (any thread) and
on its own thread, and the host stall inside it (launch-end rule). ``--match`` filters names by regular
expression; ``--json`` prints the table as one JSON line for scripts.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd

from tracing import store
from tracing.errors import InputError
from tracing.manifest import read_manifest

_NUMBERED = r"#\d+$"  # ProfilerStep#4, ProfilerStep#5 ... group as ProfilerStep#*
HELP = "per-range wall time, attributed GPU busy and host stall from an ingest directory"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, metavar="OUT", help="an `mxperf ingest` output directory")
    p.add_argument("--top", type=int, default=20, help="rows to show (default 20; 0 = all)")
    p.add_argument("--match", metavar="PATTERN", help="only range names matching this regular expression")
    p.add_argument("--phase", help="only ranges of this canonical phase")
    p.add_argument(
        "--by", choices=("name", "phase"), default="name", help="group by range name (default) or phase"
    )
    p.add_argument("--json", action="store_true", help="print the rows as one JSON line on stdout")


def summarize_ranges(
    ranges: pd.DataFrame, *, match: str | None = None, phase: str | None = None, by: str = "name"
) -> pd.DataFrame:
    """Group a ranges table by (name, phase) -- ``Name#N`` counts as ``Name#*`` -- or, with ``by="phase"``, by
    phase over the outermost range of each phase: count, wall, attributed busy, host stall (ms), stall share."""
    df = ranges
    if by == "phase":
        df = df[_outermost_of_phase(df)]
    if match:
        try:
            rx = re.compile(match)
        except re.error as exc:
            raise InputError(f"--match {match!r}: not a regular expression ({exc})") from None
        df = df[df["name"].astype(str).map(lambda n: rx.search(n) is not None).to_numpy(dtype=bool)]
    if phase:
        df = df[df["phase"] == phase]
    df = df.assign(name=df["name"].astype(str).str.replace(_NUMBERED, "#*", regex=True))
    if by == "phase":
        df = df.assign(name=df["phase"])
    g = df.groupby(["name", "phase"], observed=True, dropna=False)
    out = pd.DataFrame(
        {
            "count": g.size(),
            "wall_ms": g["wall_ns"].sum() / 1e6,
            "window_busy_ms": g["window_busy_ns"].sum(min_count=1) / 1e6,
            "thread_busy_ms": g["thread_busy_ns"].sum(min_count=1) / 1e6,
            "host_stall_ms": g["host_stall_ns"].sum(min_count=1) / 1e6,
        }
    ).reset_index()
    out["stall_share"] = out["host_stall_ms"] / out["wall_ms"].where(out["wall_ms"] > 0)
    return out.sort_values("wall_ms", ascending=False, kind="stable").reset_index(drop=True)


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
    return pd.Series(keep, index=df.index)


def render(table: pd.DataFrame) -> str:
    """A fixed-width text table (null GPU columns print as '-')."""
    if len(table) == 0:
        return "no ranges"
    cols = ["count", "wall_ms", "window_busy_ms", "thread_busy_ms", "host_stall_ms", "stall_share"]
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
    manifest = read_manifest(args.out)
    if manifest["kind"] != "ingest":
        raise InputError(
            f"{args.out}: a '{manifest['kind']}' directory; `mxperf ranges` reads `mxperf ingest` output"
        )
    if manifest["status"] != "complete":
        raise InputError(
            f"{args.out}: ingest status is '{manifest['status']}', not complete; re-run mxperf ingest"
        )
    table = summarize_ranges(
        store.read_table(args.out / store.RANGES), match=args.match, phase=args.phase, by=args.by
    )
    if args.top:
        table = table.head(args.top)
    if args.json:
        rows = json.loads(table.to_json(orient="records"))
        print(json.dumps({"schema_version": store.SCHEMA_VERSION, "ranges": rows}, separators=(",", ":")))
    else:
        print(render(table))
    return 0
