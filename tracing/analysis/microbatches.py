"""The micro-batch table (``schema.MICROBATCH_COLUMNS``, docs/contracts.md, v2) of one trace, for the cost model.

Rows come from :mod:`tracing.analysis.mbdetect`; how each column is read (tokens, precision, model, phase,
step, and which time basis ``seconds`` is: :func:`_bases`) is docs/tracing.md's ("Micro-batches"). Labels fill
only what the trace cannot say and never override what it measured.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing.analysis import attribution, kernel_classes, mbdetect, mbregions, metrics, range_tables, steps
from tracing.analysis.mbsignals import Signals
from tracing.analysis.precision import PrecisionEvidence, detect_precision, reconcile
from tracing.ingest.trace import Trace
from tracing.outputs import schema
from tracing.outputs.labels import Labels
from tracing.outputs.precisions import PRECISION_IDS

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

EXTRA_COLUMNS: dict[str, str] = {
    "pid": "int64",
    "start_ns": "int64",  # the host window (docs/contracts.md, micro-batch table), trace clock
    "end_ns": "int64",
    "tokens_from": "string",  # attrs | embedding | gemm | label
    # how long GPU work launched before the micro-batch still ran inside its host window: the host ran
    # ahead of the GPU (no sync between micro-batches), so the window includes waiting for that work
    "overlap_seconds": "float64",
    "host_seconds": "float64",  # the host window: first host op -> later of last host op, last own GPU op
    "device_seconds": "float64",  # completion interval on the device (NaN: no GPU work of its own)
    "seconds_basis": "string",  # which of the two ``seconds`` is: host | device
    "size_unit": "string",  # what the sizes count: tokens | samples | images | unknown
}
# How to record op shapes, per trace format (docs/tracing.md, "Fit your own run")
SIZES_HELP = {
    "kineto": "capture with torch.profiler record_shapes=True (verl: profiler tool_config.torch.contents="
    "[cpu,cuda,shapes]; Megatron-LM: --pytorch-profiler-collect-shapes)",
    "nsys": "capture inside torch.autograd.profiler.emit_nvtx(record_shapes=True) (Megatron-LM: --record-shapes)",
}


@dataclass
class MicrobatchResult:
    """The table plus what people need to trust it: per (process, phase) notes and the precision evidence.
    ``table``: an Arrow table inside ``mxperf ingest``, a pandas frame from :func:`find_microbatches`."""

    table: Any
    notes: list[dict[str, Any]] = field(default_factory=list)
    precision: PrecisionEvidence | None = None
    warnings: list[str] = field(default_factory=list)

    def lines(self, path: str) -> list[str]:
        """Human lines for stderr."""
        out = [f"{path}: {w}" for w in self.warnings]
        for n in self.notes:
            head = f"{path}: pid {n['pid']} {n['phase']}: "
            if n["found"] != n["microbatches"]:
                head += f"{n['found']} micro-batches found ({n['source']}), {n['microbatches']} kept"
            else:
                head += f"{n['microbatches']} micro-batches ({n['source']})"
            out.append(head + (f"; {'; '.join(n['problems'])}" if n["problems"] else ""))
        return out


def find_microbatches(
    trace: Trace,
    ranges: pd.DataFrame,
    labels: Labels | None = None,
    *,
    pattern: str | None = None,
    ops: pd.DataFrame | None = None,
    timelines: list[metrics.DeviceTimeline] | None = None,
    kernels: pd.DataFrame | None = None,
) -> MicrobatchResult:
    """The micro-batch table of one trace (``ranges`` from ``attribution.attribute_ranges``; ``kernels`` --
    ``kernel_classes.kernel_table`` -- may be passed to reuse it; ``ops`` / ``timelines``: ignored, the engine
    measures them itself); the table is a pandas frame."""
    from tracing.analysis import gpu_tables
    from tracing.analysis.mb_engine import engine_signals
    from tracing.ingest import engine

    ranges_t = ranges if schema.is_arrow(ranges) else schema.from_frame(ranges)
    with engine.session() as con:
        engine.register_frame(con, trace.events)
        num_ops = gpu_tables.make_ops(con)
        if kernels is None:
            kinds = kernel_classes.kernel_groups_table(con)
        else:
            kinds = kernels if schema.is_arrow(kernels) else schema.from_frame(kernels)
        sig = engine_signals(con, gemm_names(kinds))
        found = signals_microbatches(con, sig, trace, ranges_t, kinds, num_ops, labels, pattern)
    return replace(found, table=schema.to_frame(found.table))


def gemm_names(kernels: pa.Table) -> list[str]:
    """The names of a kernel table's GEMM kernels (every row of class ``gemm``, in table order)."""
    cls, names = kernels.column("kernel_class").to_pylist(), kernels.column("name").to_pylist()
    return [str(n) for c, n in zip(cls, names, strict=True) if str(c) == "gemm"]


def signals_microbatches(
    con: Any,
    sig: Signals,
    trace: Trace,
    ranges: pa.Table,
    evidence_from: pa.Table,
    num_ops: int,
    labels: Labels | None,
    pattern: str | None,
) -> MicrobatchResult:
    """The micro-batch table and notes from a trace's signals (``mb_engine.engine_signals``), its range table
    and the kernel table (or GPU ops) precision is read from; ``con``: the trace's engine session (the host
    stall inside each micro-batch is measured there, as a range's is)."""
    labels = labels or Labels()
    findings = _findings(sig, ranges, pattern, trace.range_log is not None, trace.path)
    evidence = detect_precision(evidence_from)
    precision, warning = reconcile(labels.precision, evidence)
    rows, notes = _rows(findings, labels, precision, evidence, trace.format)
    table, said = _table(con, rows, sig, trace.rank, num_ops > 0)
    kept = Counter(zip(table.column("pid").to_pylist(), table.column("phase").to_pylist(), strict=True))
    for n in notes:
        n["problems"] += said.get((n["pid"], n["phase"]), [])
        n["microbatches"] = kept[(n["pid"], n["phase"])]
    return MicrobatchResult(table, notes, evidence, [warning] if warning else [])


def _bases(
    pid: np.ndarray, phase: list[str], host: np.ndarray, device: np.ndarray, overlap: np.ndarray
) -> tuple[np.ndarray, np.ndarray, dict[tuple[int, str], list[str]]]:
    """The basis of each row's ``seconds`` and which rows to keep, per (process, phase): the host window while
    the GPU keeps up with the host; the device's completion interval once the host runs ahead of it (most
    windows start while earlier GPU work still runs, so they hold that wait). A GPU-bound micro-batch whose
    own GPU work cannot be timed is left out; the notes say which basis, and name every late window."""
    late = overlap > steps.LAG_SHARE * host
    basis = np.full(len(pid), "host", dtype=object)
    keep = np.ones(len(pid), bool)
    said: dict[tuple[int, str], list[str]] = {}
    phases = np.array(phase, dtype=object)
    for key in sorted(set(zip(pid.tolist(), phase, strict=True))):
        mine = (pid == key[0]) & (phases == key[1])
        k, n = int(late[mine].sum()), int(mine.sum())
        if k == 0:
            continue
        head = (
            f"{k} of {n} start while GPU work launched before them still runs (the GPU runs a median "
            f"{np.median(overlap[mine & late]) * 1e3:.3g} ms behind the host; overlap_seconds): their host windows "
            "include that wait, so "
        )
        if 2 * k <= n:  # the GPU mostly keeps up
            said[key] = [head + "they over-state their cost (seconds_basis = host, as for the rest)"]
            continue
        basis[mine] = "device"
        lost = mine & ~(device > 0)
        keep &= ~lost
        said[key] = [head + "seconds are the device's completion intervals (seconds_basis = device)"]
        if lost.any():
            said[key].append(
                f"{int(lost.sum())} left out: GPU-bound, but their own GPU work cannot be timed (no GPU op with "
                "a launch record in their window)"
            )
    return basis, keep, said


def microbatch_table(
    trace: Trace, labels: Labels | None = None, *, pattern: str | None = None
) -> pd.DataFrame:
    """:func:`find_microbatches`' table for a trace alone (notebooks: ``tracing.open(path).microbatches()``)."""
    ranges = attribution.attribute_ranges(trace)
    table: pd.DataFrame = find_microbatches(trace, ranges, labels, pattern=pattern).table
    return table


def _findings(
    sig: Signals, ranges: pa.Table, pattern: str | None, ranges_only: bool = False, source: str | None = None
) -> list[mbdetect.Finding]:
    """The cuts in output order, each with its step: explicit ranges, then phase / step regions, then whole
    processes (with no ranges, or only op ranges)."""
    regions, explicit, whole = mbregions.find_regions(ranges, pattern)
    found: list[mbdetect.Finding] = []
    inside: set[int] = set()
    for r in (SimpleNamespace(**row) for row in explicit.to_pylist()):
        host = _enclosing(regions, int(r.pid), int(r.start_ns), int(r.end_ns))
        own = str(r.phase) if str(r.phase) in mbregions.MICROBATCH_PHASES else None
        found.append(mbdetect.explicit_cut(sig, r, host.phase if host else own))
        if host is not None:
            inside.add(regions.index(host))
    if pattern is not None or ranges_only:
        # --microbatch-range names the micro-batches; an mxperf range log has no ops to cut with
        if pattern is not None and explicit.num_rows == 0:
            reason = f"no range matches --microbatch-range {pattern!r}"
            found.append(mbdetect.Finding(_NO_REGION, [], reason))
    else:
        # a range with explicit micro-batch ranges inside is cut by them
        found += [mbdetect.cut_region(sig, g) for k, g in enumerate(regions) if k not in inside]
        has_ranges = set(ranges.column("pid").to_pylist())
        for pid in sorted((set(sig.processes) - has_ranges) | set(whole)):
            region = mbregions.whole_process_region(sig, pid)
            if region is not None:
                found.append(mbdetect.cut_region(sig, region))
    return with_steps(found, regions, steps.step_windows(ranges, source))


_NO_REGION = mbregions.Region(-1, -1, None, 0, 0, -1, "")


def _enclosing(regions: list[mbregions.Region], pid: int, lo: int, hi: int) -> mbregions.Region | None:
    best = None
    for r in regions:
        inside = r.pid == pid and r.start_ns <= lo and hi <= r.end_ns
        if inside and (best is None or r.end_ns - r.start_ns < best.end_ns - best.start_ns):
            best = r
    return best


def with_steps(
    findings: list[mbdetect.Finding], regions: list[mbregions.Region], windows: dict[str, np.ndarray]
) -> list[mbdetect.Finding]:
    """Step of each cut: attributes, else the number of the step table's step holding it
    (:func:`steps.step_windows`: ``ProfilerStep#N``, or the framework's ``step`` range and its ``{"step": N}``),
    else its region's ordinal among the ranges of its phase on its process."""
    starts: dict[tuple[int, str | None], list[int]] = {}
    for r in sorted(regions, key=lambda r: r.start_ns):
        starts.setdefault((r.pid, r.phase), []).append(r.start_ns)
    pid, s0, s1, n = (windows[c] for c in ("pid", "start_ns", "end_ns", "step"))
    out = []
    for f in findings:  # the last range of its phase starting at or before it (explicit ranges sit inside)
        own = max(
            0, bisect.bisect_right(starts.get((f.region.pid, f.region.phase), []), f.region.start_ns) - 1
        )
        cuts = []
        for c in f.cuts:
            step = c.step
            if step < 0:
                hit = np.flatnonzero((pid == c.pid) & (s0 <= c.start_ns) & (c.start_ns <= s1))
                step = int(n[hit[0]]) if len(hit) else own
            cuts.append(replace(c, step=step))
        out.append(mbdetect.Finding(f.region, cuts, f.reason, f.by_forwards))
    return out


def _rows(
    findings: list[mbdetect.Finding],
    labels: Labels,
    precision: str | None,
    evidence: PrecisionEvidence,
    fmt: str,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    notes: dict[tuple[int, str], dict[str, Any]] = {}
    for f in findings:
        for c in f.cuts:
            phase = c.phase or labels.phase or ("update" if c.backward else None)
            note = _note(notes, c.pid, phase or "unknown phase")
            note["sources"][c.source] += 1
            note["found"] += 1
            tokens = c.tokens if c.tokens else None
            size = labels.tokens_per_microbatch or tokens
            prec = str(c.attrs.get("precision"))
            prec = prec if prec in PRECISION_IDS else precision  # a range's own precision attribute wins
            missing = []
            if size is None:
                missing.append("sizes could not be read")
            if prec is None:
                missing.append("precision unknown")
            if phase is None:
                missing.append("phase unknown")
            if missing:
                for m in missing:
                    note["dropped"][m] += 1
                continue
            note["microbatches"] += 1
            unit = c.unit if tokens else "tokens"  # no size read: the label's, tokens
            if labels.tokens_per_microbatch and unit != "tokens":  # the user's count of tokens wins
                tokens, unit = None, "tokens"
            if unit != "tokens":
                note["units"][unit] += 1
            rows.append(
                {
                    "model": labels.model or c.model or "unlabelled",
                    "precision": prec,
                    "phase": phase,
                    "tokens_per_microbatch": int(size),
                    "num_tokens": int(tokens or size),
                    "size_unit": unit,
                    "step": c.step,
                    "microbatch": c.microbatch,
                    "source": c.source,
                    "pid": c.pid,
                    "start_ns": c.start_ns,
                    "host_end_ns": c.host_end_ns,
                    "tokens_from": c.tokens_from if tokens else "label",
                    "peak_mem_bytes": c.attrs.get("peak_mem_bytes"),
                    "flops": c.attrs.get("flops"),
                }
            )
        if f.reason:
            _note(notes, f.region.pid, f.region.phase or labels.phase or "unknown phase")["ambiguous"].append(
                f"{f.region.name or 'whole process'} @ {f.region.start_ns}: {f.reason}"
            )
    return rows, [_finish_note(n, evidence, fmt) for n in notes.values()]


def _note(notes: dict[tuple[int, str], dict[str, Any]], pid: int, phase: str) -> dict[str, Any]:
    return notes.setdefault(
        (pid, phase),
        {
            "pid": pid,
            "phase": phase,
            "microbatches": 0,
            "found": 0,
            "sources": Counter(),
            "dropped": Counter(),
            "units": Counter(),  # kept rows whose sizes are not tokens (images, unknown)
            "ambiguous": [],
        },
    )


def _finish_note(n: dict[str, Any], evidence: PrecisionEvidence, fmt: str) -> dict[str, Any]:
    problems = []
    for what, k in n["dropped"].items():
        fix = {
            "sizes could not be read": f"{SIZES_HELP.get(fmt, SIZES_HELP['kineto'])}, or pass --label "
            "tokens_per_microbatch=N",
            "precision unknown": f"{evidence.reason}; pass --label precision=ID",
            "phase unknown": "no phase range encloses them; pass --label phase=PHASE",
        }[what]
        problems.append(f"{k} left out: {what}: {fix}")
    if n["units"]:
        counts = ", ".join(f"{k} {u}" for u, k in sorted(n["units"].items()))
        problems.append(
            f"sizes not known to be tokens ({counts}: read from a first GEMM's rows): mxperf fit refuses them; "
            "pass --label tokens_per_microbatch=N if you know the tokens"
        )
    if n["ambiguous"]:
        problems.append(
            f"{len(n['ambiguous'])} range(s) not cut, no micro-batches guessed: " + " | ".join(n["ambiguous"])
        )
    return {
        "pid": n["pid"],
        "phase": n["phase"],
        "microbatches": n["microbatches"],
        "found": n["found"],
        "source": "+".join(sorted(n["sources"])) or "none",
        "dropped": dict(n["dropped"]),
        "ambiguous": n["ambiguous"],
        "problems": problems,
    }


def _table(
    con: Any, rows: list[dict[str, Any]], sig: Signals, rank: int | None, has_gpu: bool
) -> tuple[pa.Table, dict[tuple[int, str], list[str]]]:
    cols = {**schema.MICROBATCH_COLUMNS, **EXTRA_COLUMNS}
    if not rows:
        return schema.empty_table(cols), {}
    start = np.array([r["start_ns"] for r in rows], np.int64)
    host_end = np.array([r["host_end_ns"] for r in rows], np.int64)
    pid = np.array([r["pid"] for r in rows], np.int64)
    work = [_gpu_work(sig, *w) for w in zip(pid.tolist(), start.tolist(), host_end.tolist(), strict=True)]
    last, own_busy, before = (np.array(c, np.int64) for c in zip(*work, strict=True))
    end = np.maximum(host_end, last)
    host = (end - start) / 1e9
    overlap = np.maximum(0, np.minimum(end, before) - start) / 1e9
    # completion interval: from the end of the GPU work launched before it (or its first host op, if later)
    # to the end of its last GPU op; without GPU work of its own, none
    ref = np.maximum(start, before)
    device = np.where((last >= 0) & (last > ref), (last - ref) / 1e9, np.nan)
    basis, keep, said = _bases(pid, [r["phase"] for r in rows], host, device, overlap)
    seconds = np.where(basis == "device", device, host)
    lo = np.where(basis == "device", ref, start)
    if has_gpu:
        stall = range_tables.window_stall(con, pid, lo, np.maximum(lo, end)) / 1e9
        # a process with GPU ops none of which has its launch call in the trace: the GPU work a micro-batch
        # launched and the host stall inside it are not measured (null), not 0
        measured = ~np.isin(pid, range_tables.unlaunched_pids(con))
        gpu_busy, gpu_stall = np.where(measured, own_busy / 1e9, np.nan), np.where(measured, stall, np.nan)
    else:
        gpu_busy = gpu_stall = device = np.full(len(rows), np.nan)
    # rows by (pid, phase, step, start), stably; left-out rows keep their place in the microbatch index
    by_start = sorted(range(len(rows)), key=lambda i: (pid[i], start[i]))
    order = sorted(by_start, key=lambda i: (pid[i], rows[i]["phase"], rows[i]["step"], start[i]))
    counts: Counter[tuple[Any, ...]] = Counter()
    index = {}
    for i in order:  # the index within (pid, phase, step) unless the range said
        key = (pid[i], rows[i]["phase"], rows[i]["step"])
        given = rows[i]["microbatch"]
        index[i] = given if given is not None else counts[key]
        counts[key] += 1
    order = [i for i in order if keep[i]]
    groups = sorted({(pid[i], rows[i]["step"]) for i in order})
    repeat = {g: k for k, g in enumerate(groups)}
    data: dict[str, Any] = {c: [rows[i][c] for i in order] for c in rows[0] if c in cols}
    data.update(
        pid=pid[order],
        start_ns=start[order],
        end_ns=end[order],
        seconds=seconds[order],
        host_seconds=host[order],
        device_seconds=device[order],
        seconds_basis=basis[order].astype(str),
        gpu_busy_seconds=gpu_busy[order],
        host_stall_seconds=gpu_stall[order],
        overlap_seconds=overlap[order],
        microbatch=np.array([index[i] for i in order], np.int64),
        repeat=np.array([repeat[(pid[i], rows[i]["step"])] for i in order], np.int64),
        rank=rank,
        peak_mem_bytes=[_number(rows[i]["peak_mem_bytes"]) for i in order],
        flops=[_number(rows[i]["flops"]) for i in order],
    )
    return schema.make_table(data, cols, "microbatches"), said


def _number(value: Any) -> float | None:
    """An attribute as a float (``pd.to_numeric(errors="coerce")``): numbers and numeric text; else None."""
    if value is None or isinstance(value, bool):
        return None if value is None else float(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _gpu_work(sig: Signals, pid: int, lo: int, hi: int) -> tuple[int, int, int]:
    """Of the GPU ops the process (any thread) launched in [lo, hi]: last end (-1 when none) and busy union
    (ns); and the end of the GPU work it launched before them (-1: none)."""
    p = sig.processes.get(pid)
    if p is None:
        return -1, 0, -1
    w = p.window(lo, hi)
    if len(w.op_end) == 0:
        return -1, 0, -1
    return int(w.op_end.max()), metrics.measure(w.op_start, w.op_end), int(w.prev_end[0])
