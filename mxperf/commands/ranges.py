"""``mxperf ranges OUT/``: the ranges of an ingest directory, grouped by name, heaviest first.

Per name: how often it ran, total wall time, GPU busy attributed by launches in its window (any thread) and
on its own thread, and the host stall inside it (launch-end rule). ``--match`` filters names by regular
expression; ``--json`` prints the table as one JSON line for scripts.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.manifest import read_manifest
from tracing.outputs.schema import PHASES

if TYPE_CHECKING:
    import pyarrow as pa

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


COLUMNS = (
    "count",
    "wall_ms",
    "time_ms",
    "covered_ms",
    "window_busy_ms",
    "thread_busy_ms",
    "host_stall_ms",
    "stall_share",
)
_SUMMED = {  # output column -> the ranges' column summed (null when every one is null)
    "wall_ms": "wall_ns",
    "time_ms": "time_ns",
    "window_busy_ms": "window_busy_ns",
    "thread_busy_ms": "thread_busy_ns",
    "host_stall_ms": "host_stall_ns",
}


def selected(
    ranges: pa.Table,
    *,
    match: str | None = None,
    phase: str | None = None,
    by: str = "name",
    trace: str | None = None,
) -> Any:
    """The rows :func:`group_ranges` groups (a boolean mask): ``--trace``, the outermost range of each phase
    with ``by="phase"``, ``--match``, ``--phase``."""
    import numpy as np

    keep = np.ones(ranges.num_rows, bool)
    if trace and "trace" in ranges.column_names:
        rt = _regex("--trace", trace)
        keep &= _per_value(ranges, "trace", lambda t: rt.search(str(t)) is not None)
    if by == "phase":
        keep &= _outermost_of_phase(ranges)
    if match:
        rx = _regex("--match", match)
        keep &= _per_value(ranges, "name", lambda n: rx.search(str(n)) is not None)
    if phase:
        keep &= _per_value(ranges, "phase", lambda p: p == phase)
    return keep


def gpu_notes(ranges: pa.Table) -> list[str]:
    """A note per reason some of ``ranges`` have no GPU figures (``gpu_reason``), with how many."""
    from collections import Counter

    if "gpu_reason" not in ranges.column_names:
        return []
    counts = Counter(str(r) for r in ranges.column("gpu_reason").to_pylist() if r)
    return [f"note: {n} range(s) without GPU figures ('-'): {why}" for why, n in sorted(counts.items())]


def group_ranges(t: pa.Table, by: str = "name") -> list[dict[str, Any]]:
    """Group the rows :func:`selected` kept by (name, phase) -- ``Name#N`` counts as ``Name#*`` -- or, with
    ``by="phase"``, by phase: count, host wall, window time (start -> later of end and the end of the GPU work
    it launched), the time those windows cover (their union: less than the summed window time when a group's
    ranges nest or overlap, then ``overlapping``), attributed busy, host stall (ms), stall share of the window.
    Rows (``name``, ``phase`` and :data:`COLUMNS`) by window time, longest first; ties by (name, phase)."""
    import numpy as np

    from tracing.outputs.schema import factorize

    cols = t.column_names
    if by == "phase":
        name_codes, names = factorize(t, "phase")
    else:
        name_codes, raw = factorize(t, "name")
        names = [_OP_ID.sub(r"\g<1>*", _NUMBERED.sub("#*", str(n))) for n in raw]
    phase_codes, phases = factorize(t, "phase")
    keys = sorted(
        {(names[n], phases[p]) for n, p in zip(name_codes.tolist(), phase_codes.tolist(), strict=True)},
        key=_group_order,
    )
    index = {k: i for i, k in enumerate(keys)}
    group = np.array(
        [
            index[(names[n], phases[p])]
            for n, p in zip(name_codes.tolist(), phase_codes.tolist(), strict=True)
        ],
        np.int64,
    )
    out = [{"name": k[0], "phase": k[1], "count": 0} for k in keys]
    for i, c in enumerate(np.bincount(group, minlength=len(keys)).tolist()):
        out[i]["count"] = c
    for c, src in _SUMMED.items():
        if src == "time_ns" and src not in cols:  # an ingest written before the one time basis
            src = "wall_ns"
        values = t.column(src).to_numpy().astype(np.float64)  # nulls -> NaN; sums of ns are exact below 2^53
        present = ~np.isnan(values)
        sums = np.bincount(group[present], values[present], minlength=len(keys))
        seen = np.bincount(group[present], minlength=len(keys)) > 0
        for i, (v, ok) in enumerate(zip(sums.tolist(), seen.tolist(), strict=True)):
            out[i][c] = v / 1e6 if ok else None
    start = t.column("start_ns").to_numpy()
    window = t.column("time_ns" if "time_ns" in cols else "wall_ns").to_numpy(zero_copy_only=False)
    window = np.where(np.isnan(window.astype(np.float64)), 0, window).astype(np.int64)
    covered = _covered_ns(group, len(keys), start, start + window)
    for row, c in zip(out, covered.tolist(), strict=True):
        row["covered_ms"] = c / 1e6
        row["overlapping"] = (row["time_ms"] or 0.0) * 1e6 > c + 0.5
    for row in out:  # busy and stall are measured in each range's window (start -> later of end and GPU end)
        stall, time = row["host_stall_ms"], row["time_ms"]
        row["stall_share"] = stall / time if stall is not None and time is not None and time > 0 else None
    return sorted(out, key=lambda r: -(r["time_ms"] or 0.0))  # stable: ties keep the (name, phase) order


def _covered_ns(group: Any, groups: int, start: Any, end: Any) -> Any:
    """Per group, the time its ranges cover: the length of the union of their [start, end] windows (ns; exact
    below 2^53). Less than the summed wall time when a group's ranges nest or overlap (recursion, several
    threads or ranks)."""
    import numpy as np

    if len(group) == 0:
        return np.zeros(groups, np.float64)
    times, rank = np.unique(np.concatenate([start, end]), return_inverse=True)
    s_rank, e_rank = rank[: len(start)], rank[len(start) :]
    order = np.lexsort((s_rank, group))
    g, s, e = group[order], s_rank[order], e_rank[order]
    shift = g * (len(times) + 1)  # groups never mix in the running maximum: each sits above the previous
    upto = (
        np.maximum.accumulate(shift + e + 1) - shift - 1
    )  # the latest end so far within the group (-1: none)
    before = np.concatenate([[-1], upto[:-1]])
    before[np.concatenate([[True], g[1:] != g[:-1]])] = -1
    lo = np.where(before >= 0, np.maximum(times[s], times[np.maximum(before, 0)]), times[s])
    part = np.maximum(times[e] - lo, 0).astype(np.float64)
    return np.bincount(g, part, minlength=groups)


def _per_value(ranges: pa.Table, column: str, test: Any) -> Any:
    """``test`` of each row's value of a string column, called once per distinct value."""
    import numpy as np

    from tracing.outputs.schema import factorize

    codes, values = factorize(ranges, column)
    return np.array([bool(test(v)) for v in values] + [False], bool)[codes]


def _group_order(key: tuple[Any, Any]) -> tuple[Any, ...]:
    """Groups sorted as pandas' groupby sorts them: by name, then phase, a missing value last."""
    return tuple(x for v in key for x in (v is None, "" if v is None else str(v)))


def _outermost_of_phase(ranges: pa.Table) -> Any:
    """True for ranges with no ancestor of the same phase (so per-phase totals never count time twice)."""
    import numpy as np

    n = ranges.num_rows
    traces = ranges.column("trace").to_pylist() if "trace" in ranges.column_names else [""] * n
    rid, parent, phase = (ranges.column(c).to_pylist() for c in ("range_id", "parent_id", "phase"))
    info = {(t, int(r)): (int(p), ph) for t, r, p, ph in zip(traces, rid, parent, phase, strict=True)}
    keep = np.ones(n, bool)
    for i, (t, up, ph) in enumerate(zip(traces, parent, phase, strict=True)):
        p = int(up)
        while p >= 0 and (t, p) in info:
            p, above = info[(t, p)]
            if above == ph:
                keep[i] = False
                break
    return keep


def render(table: list[dict[str, Any]]) -> str:
    """A fixed-width text table (null GPU columns print as '-')."""
    if len(table) == 0:
        return "no ranges"
    width = min(60, max(len("name"), *(len(str(r["name"])) for r in table)))
    lines = [f"{'name':<{width}}   {'phase':<8} " + " ".join(f"{c:>14}" for c in COLUMNS)]
    for r in table:
        name = str(r["name"]) if len(str(r["name"])) <= width else str(r["name"])[: width - 1] + "…"
        vals = []
        for c in COLUMNS:
            v = r[c]
            vals.append(f"{'-':>14}" if v is None else f"{int(v):>14d}" if c == "count" else f"{v:>14.3f}")
        mark = "*" if r.get("overlapping") else " "
        lines.append(f"{name:<{width}} {mark} {r['phase']!s:<8} " + " ".join(vals))
    if any(r.get("overlapping") for r in table):
        lines.append(
            "* its ranges' windows overlap (nested ranges, several threads / ranks, or windows stretched to GPU work "
            "finishing later): time_ms adds them up, covered_ms is the time they cover"
        )
    return "\n".join(lines)


def run_traces(traces: list[dict[str, Any]]) -> dict[str, str]:
    """Trace path -> the range log of the run folder it lies in (``mxperf ingest RUN`` reads a run's range log and
    its own traces: the same ranges of the traced steps, seen twice)."""
    logs = [Path(t["path"]) for t in traces if t.get("format") == "rangelog" and Path(t["path"]).suffix == ""]
    out = {}
    for t in traces:
        if t.get("format") in ("kineto", "nsys"):
            run = next((log for log in logs if log in Path(t["path"]).parents), None)
            if run is not None:
                out[str(t["path"])] = str(run)
    return out


def one_source_per_range(ranges: pa.Table, twins: dict[str, str]) -> tuple[pa.Table, list[str]]:
    """``ranges`` without a run's trace rows whose name its range log also has (the log covers every step, the
    trace only the profiled ones), and a note per run naming what overlapped."""
    import numpy as np

    from tracing.outputs.schema import factorize

    if not twins:
        return ranges, []
    t_codes, traces = factorize(ranges, "trace")
    n_codes, names = factorize(ranges, "name")
    drop = np.zeros(ranges.num_rows, bool)
    notes = []
    for log in sorted(set(twins.values())):
        if log not in traces:
            continue
        in_log = set(np.unique(n_codes[t_codes == traces.index(log)]).tolist())
        mine = [traces.index(tr) for tr, lg in twins.items() if lg == log and tr in traces]
        rows = np.isin(t_codes, mine) & np.isin(n_codes, list(in_log))
        if rows.any():
            drop |= rows
            shared = sorted({str(names[c]) for c in np.unique(n_codes[rows]).tolist()})
            files = ", ".join(Path(traces[c]).name for c in mine)
            notes.append(
                f"note: {Path(log).name}'s range log and its trace ({files}) both hold {len(shared)} range "
                f"name(s) ({', '.join(shared[:4])}{', ...' if len(shared) > 4 else ''}) for the profiled steps: "
                f"counted once, from the range log (every step); --trace {Path(traces[mine[0]]).name} shows the "
                "trace's own (with GPU time)"
            )
    return ranges.filter(~drop), notes


def _json_value(v: Any) -> Any:
    """A cell as pandas' ``to_json`` wrote it: floats to 10 decimals, NaN and missing as null."""
    if isinstance(v, float):
        return None if math.isnan(v) or math.isinf(v) else round(v, 10)
    return v


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
    ranges = store.read_arrow(args.out / store.RANGES)
    has_trace = "trace" in ranges.column_names
    notes: list[str] = []
    if has_trace and not args.trace:
        ranges, notes = one_source_per_range(ranges, run_traces(manifest.get("traces") or []))
    chosen = ranges.filter(selected(ranges, match=args.match, phase=args.phase, by=args.by, trace=args.trace))
    table = group_ranges(chosen, args.by)
    notes += gpu_notes(chosen)
    sources = (
        sorted({str(t) for t in ranges.column("trace").to_pylist()}) if has_trace and not args.trace else []
    )
    if len(sources) > 1 and not notes:  # several ranks or files: each row adds up over them
        notes.append(
            f"note: ranges from {len(sources)} sources ({', '.join(Path(s).name for s in sources)}) add up in "
            "each row; --trace PATTERN picks one"
        )
    for line in notes:
        print(line, file=sys.stderr)
    if args.top:
        table = table[: args.top]
    if args.json:
        rows = [{k: _json_value(v) for k, v in r.items()} for r in table]
        print(json.dumps({"schema_version": store.SCHEMA_VERSION, "ranges": rows}, separators=(",", ":")))
    else:
        print(render(table))
    return 0
