"""Across ranks: per-rank step times, the slowest rank of each step (stragglers), and what the job waits for.

Input is the per-process step table (``schema.STEP_COLUMNS``). A synchronous data-parallel step ends when its
slowest rank ends, so the job's step time is the *maximum* over ranks, never a sum or a mean; the straggler's
lag is how much longer it took than the median rank of the same step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

_KEYS = ("trace", "rank", "pid")


def _missing(value: object) -> bool:
    """None, NaN or pandas' NA (without importing pandas)."""
    if value is None or type(value).__name__ in ("NAType", "NaTType"):
        return True
    return isinstance(value, float) and value != value


def process_label(rank: object, pid: object) -> str:
    """``rank 3``, or ``pid 4037`` when the trace names no rank (a null rank is never shown as 'None')."""
    if not _missing(rank):
        return f"rank {int(rank)}"  # type: ignore[call-overload]
    if not _missing(pid):
        return f"pid {int(pid)}"  # type: ignore[call-overload]
    return "unknown process"


def ident_labels(recs: Sequence[Mapping[str, Any]]) -> list[str]:
    """:func:`process_label` of each distinct (trace, rank, pid) (dicts holding some of those keys); where one
    label covers several -- two traces that both call themselves rank 0 -- the trace's file name (its whole
    path when the names collide too, and the pid when one trace holds both) is added so they stay apart."""
    base = [process_label(r.get("rank"), r.get("pid")) for r in recs]
    groups: dict[str, list[int]] = {}
    for i, label in enumerate(base):
        groups.setdefault(label, []).append(i)
    names = list(base)
    for label, idx in groups.items():
        if len(idx) < 2:
            continue
        traces = [str(recs[i].get("trace") or "") for i in idx]
        shorts = [t.rsplit("/", 1)[-1] for t in traces]
        for i, trace, short in zip(idx, traces, shorts, strict=True):
            extra = trace if shorts.count(short) > 1 else short
            if traces.count(trace) > 1 and "pid" in recs[i] and not label.startswith("pid"):
                extra = f"{extra} pid {recs[i]['pid']}".strip()
            names[i] = f"{label} ({extra})"
    return names


def process_labels(df: pd.DataFrame) -> np.ndarray:
    """:func:`process_label` per row, kept apart as :func:`ident_labels` keeps them."""
    import pandas as pd

    keys = [k for k in _KEYS if k in df.columns]
    if df.empty:
        return np.asarray([], dtype=object)
    ident = df[keys].drop_duplicates() if keys else pd.DataFrame(index=[0])
    names = ident_labels(ident.to_dict("records"))
    if not keys:
        return np.asarray(names * len(df), dtype=object)
    lookup = ident.assign(_label=names)
    merged = df[keys].merge(lookup, on=keys, how="left")
    return merged["_label"].to_numpy(dtype=object)


def step_totals(steps: pd.DataFrame) -> pd.DataFrame:
    """Seconds per (process, step): the sum over that process's phases (they partition its step).

    Columns ``process, trace, rank, pid, step, seconds``; ``process`` is :func:`process_label`.
    """
    import pandas as pd

    keys = [k for k in _KEYS if k in steps.columns]
    if steps.empty:
        return pd.DataFrame(columns=["process", *keys, "step", "seconds"])
    totals = steps.groupby([*keys, "step"], dropna=False, as_index=False)["seconds"].sum()
    # rows by rank *number* (then pid, then path): ties between ranks go to the lowest rank, never to the
    # path that sorts first as text ("rank-127.json" < "rank-27.json")
    order = [k for k in ("rank", "pid", "trace") if k in keys]
    totals = totals.sort_values([*order, "step"], kind="stable", na_position="last", ignore_index=True)
    totals.insert(0, "process", process_labels(totals))
    return totals


def stragglers(steps: pd.DataFrame) -> pd.DataFrame:
    """:func:`straggler_table` of a step table frame (``trace`` / ``rank`` / ``pid`` may be missing), as a frame:
    the rows ``stragglers.parquet`` holds."""
    import pyarrow as pa

    from tracing.analysis.steps import objects
    from tracing.outputs import schema

    table = pa.table(
        {
            "trace": pa.array(
                [None if t is None else str(t) for t in objects(steps, "trace")], pa.large_string()
            ),
            "rank": pa.array(objects(steps, "rank"), pa.int64()),
            "pid": pa.array(objects(steps, "pid"), pa.int64()),
            "step": pa.array(steps["step"].to_numpy(np.int64)),
            "seconds": pa.array(steps["seconds"].to_numpy(np.float64)),
            **({"phase": pa.array(objects(steps, "phase"), pa.string())} if "phase" in steps.columns else {}),
        }
    )
    return schema.to_frame(straggler_table(table))


def straggler_table(steps: pa.Table) -> pa.Table:
    """One row per step (``schema.STRAGGLER_COLUMNS``): the slowest and fastest process, the median, and the
    slowest one's lag; each process's step is the sum of its phases (``trace``, ``rank``, ``pid``, ``step``,
    ``seconds`` rows; a missing rank or pid is null).

    Where the table has phases and its processes play several roles (:func:`process_roles`: a sampler beside
    the learner ranks), the ranks compared are those of the role most processes play.

    ``job_seconds`` (= ``slowest_seconds``) is the step time the job waits for. ``lag_seconds`` = slowest -
    median over processes; ``spread_pct`` = (slowest - fastest) / fastest. ``processes`` counts the processes
    that ran the step (a step missing on some rank is visible here). Ties go to the lowest rank number, then
    pid, then path -- never to the path that sorts first as text ("rank-127" < "rank-27")."""
    from tracing.analysis.steps import kahan_sum, process_roles
    from tracing.outputs import schema

    trace, rank, pid, step, seconds = (
        steps.column(c).to_pylist() for c in ("trace", "rank", "pid", "step", "seconds")
    )
    ranks_of = None  # processes of several roles: the ranks are those of the role most processes play
    if "phase" in steps.column_names:
        roles = process_roles(trace, rank, pid, steps.column("phase").to_pylist(), seconds)
        counts: dict[str, int] = {}
        for role in roles.values():
            counts[role] = counts.get(role, 0) + 1
        if len(counts) > 1:
            main = min(counts, key=lambda r: (-counts[r], r))
            ranks_of = {k for k, r in roles.items() if r == main}
    sums: dict[tuple[Any, ...], list[float]] = {}  # (trace, rank, pid, step) -> its phases' seconds
    for key, s in zip(zip(trace, rank, pid, step, strict=True), seconds, strict=True):
        if ranks_of is None or key[:3] in ranks_of:
            sums.setdefault(key, []).append(s)

    def order(k: tuple[Any, ...]) -> tuple[Any, ...]:  # nulls last
        return (k[1] is None, k[1] or 0, k[2] is None, k[2] or 0, k[0] or "", k[3])

    keys = sorted(sums, key=order)
    idents = list(dict.fromkeys((k[0], k[1], k[2]) for k in keys))
    label = dict(
        zip(idents, ident_labels([{"trace": t, "rank": r, "pid": p} for t, r, p in idents]), strict=True)
    )
    rows = []
    for s in sorted({k[3] for k in keys}):
        grp = [(label[k[:3]], k[1], kahan_sum(sums[k])) for k in keys if k[3] == s]
        secs = [g[2] for g in grp]
        slow, fast = grp[int(np.argmax(secs))], grp[int(np.argmin(secs))]
        med = float(np.median(secs))
        rows.append(
            {
                "step": int(s),
                "processes": len(grp),
                "slowest": slow[0],
                "slowest_rank": slow[1],
                "slowest_seconds": float(slow[2]),
                "fastest": fast[0],
                "fastest_rank": fast[1],
                "fastest_seconds": float(fast[2]),
                "median_seconds": med,
                "lag_seconds": float(slow[2]) - med,
                "spread_pct": 100 * (float(slow[2]) / float(fast[2]) - 1) if fast[2] > 0 else float("nan"),
                "job_seconds": float(slow[2]),
            }
        )
    cols = schema.STRAGGLER_COLUMNS
    return schema.make_table({c: [r[c] for r in rows] for c in cols}, cols, "stragglers")


def rank_summary(steps: pd.DataFrame, skip_steps: tuple[int, ...] = ()) -> pd.DataFrame:
    """One row per process: steps seen, median step seconds with its quartiles, and how often it was the
    slowest (the straggler count). ``skip_steps`` are left out (e.g. the warm-up step)."""
    import pandas as pd

    totals = step_totals(steps)
    totals = totals[~totals["step"].isin(skip_steps)] if len(totals) else totals
    cols = ["process", "steps", "median_s", "q1_s", "q3_s", "slowest_in"]
    if totals.empty:
        return pd.DataFrame(columns=cols)
    slow = stragglers(steps)
    slow = slow[~slow["step"].isin(skip_steps)]
    slow_count = slow[slow["processes"] > 1]["slowest"].value_counts()
    g = totals.groupby("process", sort=False)["seconds"]
    out = pd.DataFrame(
        {
            "steps": g.size(),
            "median_s": g.median(),
            "q1_s": g.quantile(0.25),
            "q3_s": g.quantile(0.75),
        }
    )
    out["slowest_in"] = slow_count.reindex(out.index).fillna(0).astype(int)
    return out.reset_index().rename(columns={"index": "process"})[cols]


def one_rank(steps: pd.DataFrame, process: str) -> pd.DataFrame:
    """``step, phase, seconds`` of one process (by :func:`process_label`)."""
    import pandas as pd

    if steps.empty:
        return pd.DataFrame({"step": [], "phase": [], "seconds": []})
    sel = steps[process_labels(steps) == process]
    return sel[["step", "phase", "seconds"]].reset_index(drop=True)


def processes(steps: pd.DataFrame) -> list[str]:
    """The processes of a step table, ranks first in rank order, then pids."""
    import pandas as pd

    totals = step_totals(steps)
    if totals.empty:
        return []
    order = totals.drop_duplicates("process").assign(
        _r=lambda d: pd.to_numeric(d.get("rank"), errors="coerce").astype("float64").fillna(np.inf),
        _p=lambda d: pd.to_numeric(d.get("pid"), errors="coerce").astype("float64").fillna(np.inf),
    )
    return list(order.sort_values(["_r", "_p"])["process"])
