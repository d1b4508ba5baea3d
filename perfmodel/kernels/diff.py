"""``mxperf diff A B``: where the time difference between two ingests (typically BF16 vs MXFP8 of one workload)
comes from, kernel class by kernel class, with nothing hidden.

Per micro-batch, on its window (docs/contracts.md: first host op -> later of last host op and end of its last
GPU op), the identity

    wall = gemm + quantize + other kernels + host stall + residual

holds exactly in integer ns: the three kernel terms are the summed durations of the GPU ops the micro-batch
launched (``perfmodel.kernels.ops``: class from the ingest's kernel table; memcpy / memset are "other"), host
stall is the ingest's (launch-end rule, inside the window), and ``residual = wall - host stall - kernel sum``:
GPU idle time not caused by the host, minus kernel time that overlapped other kernels (several streams).
Differences of these terms (B - A) add up to the measured difference by construction; the residual line is
always printed. Launches (GPU ops launched) are counted next to it: a count, not a time.

Three views:
- ``by_size``: micro-batches matched by (phase, tokens per micro-batch), mean per micro-batch on each side;
- ``by_phase``: per phase, mean per step: the phase's measured time (``steps.parquet``) = the parts of its
  micro-batches + "outside micro-batches" (the phase time no micro-batch window covers; negative when
  windows overlap);
- ``by_step``: the same per step (steps matched by number), all phases of the step.
Kernels present on one side only are named with their time per micro-batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfmodel.kernels.ops import open_ops, placement_note

PARTS = ("gemm_ns", "quantize_ns", "other_ns", "host_stall_ns", "residual_ns")
LABELS = {
    "gemm_ns": "GEMM kernels",
    "quantize_ns": "quantize / cast kernels",
    "other_ns": "other kernels (attention, elementwise, comm, copies)",
    "host_stall_ns": "host stall (GPU idle waiting for a launch)",
    "residual_ns": "residual (other GPU idle - multi-stream overlap)",
    "outside_ns": "outside micro-batches",
}

_MB_SQL = """
select m.mb_id, m.phase, m.step, m.microbatch, m.tokens_per_microbatch as tokens, m.wall_ns,
       coalesce(m.stall_ns, 0) as host_stall_ns,
       coalesce(sum(o.dur_ns) filter (where o.kernel_class = 'gemm'), 0)::bigint as gemm_ns,
       coalesce(sum(o.dur_ns) filter (where o.kernel_class = 'quantize'), 0)::bigint as quantize_ns,
       coalesce(sum(o.dur_ns) filter (where o.kernel_class not in ('gemm', 'quantize')), 0)::bigint as other_ns,
       count(o.dur_ns)::bigint as launches
from mb m left join ops o on o.mb_id = m.mb_id
group by all order by m.mb_id
"""


def microbatch_parts(con: Any) -> list[dict[str, Any]]:
    """One row per micro-batch: the identity's terms in integer ns (``residual_ns`` closes it exactly)."""
    cur = con.execute(_MB_SQL)
    cols = [d[0] for d in cur.description]
    rows = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    for r in rows:
        for c in ("wall_ns", "host_stall_ns", "gemm_ns", "quantize_ns", "other_ns", "launches"):
            r[c] = int(r[c] or 0)
        r["residual_ns"] = r["wall_ns"] - r["host_stall_ns"] - r["gemm_ns"] - r["quantize_ns"] - r["other_ns"]
    return rows


def _step_seconds(con: Any, out: Path) -> dict[tuple[int, str], int]:
    """(step, phase) -> measured ns summed over the ingest's processes (a metric log's rows left out)."""
    path = out / "steps.parquet"
    if not path.is_file():
        return {}
    rows = con.execute(
        "select step, phase, sum(round(seconds * 1e9))::bigint from read_parquet(?) "
        "where pid >= 0 and seconds = seconds group by all",
        [str(path)],
    ).fetchall()
    return {(int(s), str(p)): int(ns) for s, p, ns in rows}


def _kernel_names(con: Any) -> dict[str, dict[str, Any]]:
    rows = con.execute(
        "select name, any_value(kernel_class), count(*), sum(dur_ns)::bigint, "
        "sum(case when mb_id is not null then dur_ns else 0 end)::bigint from ops group by name"
    ).fetchall()
    return {
        n: {"name": n, "kernel_class": c, "count": int(k), "total_ns": int(t), "in_microbatches_ns": int(m)}
        for n, c, k, t, m in rows
    }


def side(out: str | Path) -> dict[str, Any]:
    """What one ingest contributes to a diff: its micro-batch parts, step / phase times and kernel names."""
    out = Path(out)
    with open_ops(out) as con:
        parts = microbatch_parts(con)
        steps = _step_seconds(con, out)
        names = _kernel_names(con)
        precision = con.execute("select string_agg(distinct precision, ',') from mb").fetchone()[0]
        unmeasured = con.execute("select count(*) from mb where stall_ns is null").fetchone()[0]
        placement = placement_note(con)
    return {
        "path": str(out),
        "microbatches": parts,
        "steps": steps,
        "kernels": names,
        "precision": precision,
        "stall_unmeasured": int(unmeasured),  # micro-batches whose host stall the ingest could not measure
        "placement_note": placement,  # where GPU ops without a launch call went (ops.placement_note)
    }


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows) if rows else 0.0


def _delta(a: dict[str, float], b: dict[str, float], keys: tuple[str, ...]) -> dict[str, float]:
    return {k: b[k] - a[k] for k in keys}


def _by_size(sa: dict[str, Any], sb: dict[str, Any]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int], tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for i, s in enumerate((sa, sb)):
        for r in s["microbatches"]:
            if r["tokens"] is None:
                continue
            groups.setdefault((str(r["phase"]), int(r["tokens"])), ([], []))[i].append(r)
    out = []
    keys = ("wall_ns", *PARTS, "launches")
    for (phase, tokens), (ra, rb) in sorted(groups.items()):
        if not ra or not rb:
            continue
        a = {k: _mean(ra, k) for k in keys}
        b = {k: _mean(rb, k) for k in keys}
        out.append(
            {
                "phase": phase,
                "tokens": tokens,
                "n_a": len(ra),
                "n_b": len(rb),
                "a": a,
                "b": b,
                "delta": _delta(a, b, keys),
            }
        )
    return out


def _grouped(s: dict[str, Any], key: Any) -> dict[Any, dict[str, int]]:
    """Sums of the parts of ``s``'s micro-batches per ``key(row)``, plus their windows and counts."""
    out: dict[Any, dict[str, int]] = {}
    for r in s["microbatches"]:
        k = key(r)
        if k is None:
            continue
        acc = out.setdefault(k, dict.fromkeys(("windows_ns", *PARTS, "launches", "microbatches"), 0))
        acc["windows_ns"] += r["wall_ns"]
        for p in (*PARTS, "launches"):
            acc[p] += r[p]
        acc["microbatches"] += 1
    return out


def _closed(measured: int, acc: dict[str, int] | None) -> dict[str, int]:
    """The parts of a measured time: its micro-batches' parts plus what no micro-batch window covers."""
    acc = acc or dict.fromkeys(("windows_ns", *PARTS, "launches", "microbatches"), 0)
    row = {"wall_ns": measured, **{p: acc[p] for p in PARTS}}
    row["outside_ns"] = measured - acc["windows_ns"]
    row["launches"] = acc["launches"]
    row["microbatches"] = acc["microbatches"]
    return row


def _by_phase(sa: dict[str, Any], sb: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    steps_a = {s for s, _ in sa["steps"]}
    steps_b = {s for s, _ in sb["steps"]}
    common = sorted(steps_a & steps_b)
    if not common:
        return out
    phases = sorted({p for _, p in sa["steps"]} | {p for _, p in sb["steps"]})
    keys = ("wall_ns", *PARTS, "outside_ns", "launches")
    for phase in phases:
        sides = []
        for s in (sa, sb):
            acc = _grouped(
                s, lambda r, ph=phase: r["step"] if r["phase"] == ph and r["step"] in common else None
            )
            rows = [_closed(s["steps"].get((st, phase), 0), acc.get(st)) for st in common]
            sides.append({k: sum(r[k] for r in rows) / len(common) for k in keys})
        if sides[0]["wall_ns"] == 0 and sides[1]["wall_ns"] == 0:
            continue
        out.append(
            {
                "phase": phase,
                "steps": len(common),
                "a": sides[0],
                "b": sides[1],
                "delta": _delta(sides[0], sides[1], keys),
            }
        )
    return out


def _by_step(sa: dict[str, Any], sb: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    keys = ("wall_ns", *PARTS, "outside_ns", "launches")
    tot = []
    for s in (sa, sb):
        t: dict[int, int] = {}
        for (st, _), ns in s["steps"].items():
            t[st] = t.get(st, 0) + ns
        tot.append(t)
    acc = [_grouped(s, lambda r: r["step"]) for s in (sa, sb)]
    for st in sorted(set(tot[0]) & set(tot[1])):
        a = _closed(tot[0][st], acc[0].get(st))
        b = _closed(tot[1][st], acc[1].get(st))
        tokens = [sum(r["tokens"] or 0 for r in s["microbatches"] if r["step"] == st) for s in (sa, sb)]
        out.append(
            {
                "step": st,
                "tokens_a": tokens[0],
                "tokens_b": tokens[1],
                "a": a,
                "b": b,
                "delta": _delta(a, b, keys),
            }
        )
    return out


def _only(sa: dict[str, Any], sb: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    res = {}
    for label, mine, other, s in (("only_a", sa, sb, sa), ("only_b", sb, sa, sb)):
        n_mb = len(s["microbatches"]) or None
        rows = [dict(v) for k, v in mine["kernels"].items() if k not in other["kernels"]]
        for r in rows:
            r["per_microbatch_ns"] = r["in_microbatches_ns"] / n_mb if n_mb else None
        res[label] = sorted(rows, key=lambda r: (-r["total_ns"], r["name"]))
    return res


def _terms(sa: dict[str, Any], sb: dict[str, Any]) -> list[dict[str, Any]]:
    """Per phase, the cost model's two terms of B - A split by part: each side's least-squares line of each
    part over its micro-batches (ns against tokens), B's intercept and slope minus A's. A line is linear in
    its data, so the parts' intercepts add up to the wall's (the fixed cost) and their slopes to its per-token
    cost, exactly up to rounding. Needs two sizes on each side."""
    import numpy as np

    keys = ("wall_ns", *PARTS)
    out = []
    for phase in sorted({str(r["phase"]) for s in (sa, sb) for r in s["microbatches"]}):
        lines, sizes = [], []
        for s in (sa, sb):
            rows = [r for r in s["microbatches"] if str(r["phase"]) == phase and r["tokens"] is not None]
            x = np.array([float(r["tokens"]) for r in rows])
            if len(set(x.tolist())) < 2:
                break
            sizes.append(len(set(x.tolist())))
            design = np.column_stack([np.ones(len(x)), x])
            y = np.array([[float(r[k]) for k in keys] for r in rows])
            lines.append(np.linalg.lstsq(design, y, rcond=None)[0])  # rows: intercept, slope; a column a key
        if len(lines) < 2:
            continue
        d = lines[1] - lines[0]
        out.append(
            {
                "phase": phase,
                "sizes": sizes,  # distinct micro-batch sizes per side: two make a line with no check of fit
                "fixed_ns": {k: float(d[0, i]) for i, k in enumerate(keys)},
                "per_token_ns": {k: float(d[1, i]) for i, k in enumerate(keys)},
            }
        )
    return out


def diff(a: str | Path, b: str | Path) -> dict[str, Any]:
    """The ``mxperf diff --json`` document: ``by_size``, ``by_phase``, ``by_step``, ``only_a`` / ``only_b``."""
    sa, sb = side(a), side(b)
    doc: dict[str, Any] = {
        "a": {"path": sa["path"], "precision": sa["precision"], "microbatches": len(sa["microbatches"])},
        "b": {"path": sb["path"], "precision": sb["precision"], "microbatches": len(sb["microbatches"])},
        "by_size": _by_size(sa, sb),
        "by_phase": _by_phase(sa, sb),
        "by_step": _by_step(sa, sb),
        "terms": _terms(sa, sb),
    }
    doc.update(_only(sa, sb))
    cpu_only = [k for k, s in (("A", sa), ("B", sb)) if not s["kernels"]]
    doc["notes"] = (
        [
            f"no GPU ops in {' and '.join(cpu_only)} (a CPU-only trace): its kernel and host-stall parts are 0 "
            "and its whole time is in the residual, which there is CPU time, not GPU idle; a CPU run's "
            "low-precision GEMMs are emulated, so the difference is the emulation's"
        ]
        if cpu_only
        else []
    )
    doc["notes"] += _unlaunched_notes({"A": sa, "B": sb})
    return doc


def _unlaunched_notes(sides: dict[str, dict[str, Any]]) -> list[str]:
    """What a side without launch calls (a trace whose CUDA runtime events were not captured) does to the parts."""
    notes = []
    for k, s in sides.items():
        if (
            not s["kernels"] or not s["microbatches"]
        ):  # a CPU-only side has its own note; no windows, no parts
            continue
        n = s["stall_unmeasured"]
        if n:
            notes.append(
                f"{k}: host stall not measured in {n} of {len(s['microbatches'])} micro-batches (the trace has no "
                "launch calls for their GPU work): their host stall reads 0 and sits in the residual"
            )
        if s["placement_note"]:
            notes.append(f"{k}: {s['placement_note']}")
    return notes


def check_closed(row: dict[str, Any]) -> float:
    """``delta.wall_ns`` minus the sum of the delta's parts (0 up to float rounding for every view)."""
    d = row["delta"]
    parts = sum(d[p] for p in PARTS) + d.get("outside_ns", 0.0)
    return d["wall_ns"] - parts
