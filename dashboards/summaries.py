"""What the Host stall, Consistency and Weight sync pages say: pure functions over finished tables.

Each function takes tables or ``fits.json`` entries and returns a smaller table or a sentence; none reads
files or touches Streamlit. Numbers that only exist with a GPU trace (host stall, GPU busy) come back as
null together with the reason, never as zeros.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from tracing.analysis import ranks
from tracing.analysis.gpu_tables import stall_unmeasured

NO_GPU_REASON = (
    "no GPU trace: these micro-batches ran on CPU (or without --trace), so there are no GPU ops to be busy "
    "or to wait for the host. Host stall needs a GPU trace: run a sweep with --trace on a GPU, or ingest one "
    "(mxperf ingest TRACE -o RUNS_DIR/NAME)."
)
INVARIANTS: dict[str, str] = {
    "I1": "grid identity",
    "I2": "coverage",
    "I3": "layout and mapping",
    "I4": "derived-state freshness",
    "I5": "precision policy",
    "I6": "auxiliary state",
    "I7": "version atomicity",
}


# --------------------------------------------------------------------------------------------- host stall
def has_gpu_numbers(mb: pd.DataFrame, column: str = "host_stall_seconds") -> bool:
    return column in mb.columns and bool(mb[column].notna().any())


STALL_PCT = "host stall %"
BUSY_PCT = "GPU busy %"


def stall_share(mb: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Host-stall share of wall time in percent, grouped: 100 x sum(host_stall_seconds) / sum(seconds) over
    traced rows (``host stall %``, ``GPU busy %``: percent, as every other share on the pages).

    Rows without a GPU trace are left out of both sums; a group with none has share null and ``reason``.
    """
    traced = mb["host_stall_seconds"].notna() if "host_stall_seconds" in mb else pd.Series(False, mb.index)
    g = mb.assign(
        _stall=pd.to_numeric(mb.get("host_stall_seconds"), errors="coerce").astype("float64"),
        _wall=mb["seconds"].where(traced).astype("float64"),
        _busy=pd.to_numeric(mb.get("gpu_busy_seconds"), errors="coerce").astype("float64")
        if "gpu_busy_seconds" in mb
        else np.nan,
        _traced=traced,
    ).groupby(list(by), dropna=False)
    out = g.agg(
        microbatches=("seconds", "size"),
        traced=("_traced", "sum"),
        seconds=("_wall", "sum"),
        host_stall_seconds=("_stall", "sum"),
        gpu_busy_seconds=("_busy", "sum"),
    ).reset_index()
    has = out["traced"] > 0
    out[STALL_PCT] = (100 * out["host_stall_seconds"] / out["seconds"]).where(has)
    out[BUSY_PCT] = (100 * out["gpu_busy_seconds"] / out["seconds"]).where(
        has & (out["gpu_busy_seconds"] > 0)
    )
    out.loc[~has, ["seconds", "host_stall_seconds", "gpu_busy_seconds"]] = np.nan
    out["reason"] = np.where(has, "", "no GPU trace for these micro-batches")
    return out


def device_summary(devices: pd.DataFrame) -> pd.DataFrame:
    """``devices.parquet`` for people: one row per (process, GPU), ms and shares of the GPU's active span. Where
    the trace lacks the launch calls for much of a GPU's idle, "unmeasured ms" says how much, and a host stall
    of which nothing was measured is blank, not 0 (``gpu_tables.stall_unmeasured``, as ``mxperf ingest`` says it)."""
    span = devices["span_ns"].where(devices["span_ns"] > 0)
    stall = devices["host_stall_ns"].astype("float64")
    if "unattributed_ns" in devices:
        unknown = stall_unmeasured(devices["unattributed_ns"], devices["idle_ns"], devices["span_ns"])
        stall = stall.where(~(unknown & (stall == 0)))
    out = pd.DataFrame(
        {
            "process": ranks.process_labels(devices),
            "GPU": devices["device"],
            "span ms": devices["span_ns"] / 1e6,
            "busy ms": devices["busy_ns"] / 1e6,
            "host stall ms": stall / 1e6,
            "other idle ms": (devices["idle_ns"] - stall) / 1e6,
            "busy %": 100 * devices["busy_ns"] / span,
            "host stall %": 100 * stall / span,
            "kernels": devices.get("num_kernels"),
        }
    )
    if "unattributed_ns" in devices:
        out.insert(out.columns.get_loc("other idle ms"), "unmeasured ms", devices["unattributed_ns"] / 1e6)
    return out.round(2)


def microbatch_words(mb: pd.DataFrame | None, notes: Sequence[str] = ()) -> str:
    """'24 micro-batches in this trace: logprob 12 (detected), update 12 (detected); 512 to 4,096 tokens' --
    or why there are none (the ingest's own notes)."""
    if mb is None or mb.empty:
        why = "; ".join(str(n) for n in notes if n) or "no micro-batch ranges found and none detected"
        return f"No micro-batches in this trace ({why})."
    by = (
        mb.groupby(["phase", "source"], dropna=False).size() if "source" in mb else mb.groupby("phase").size()
    )
    parts = [f"{k[0]} {v} ({k[1]})" if isinstance(k, tuple) else f"{k} {v}" for k, v in by.items()]
    tokens = pd.to_numeric(mb.get("num_tokens"), errors="coerce").dropna()
    span = f"; {tokens.min():,.0f} to {tokens.max():,.0f} tokens" if len(tokens) else ""
    return f"{len(mb)} micro-batches in this trace: " + ", ".join(parts) + span + "."


# --------------------------------------------------------------------------------------------- consistency
CONSISTENCY_METRICS: tuple[str, ...] = ("kl_k1", "kl_k3", "token_mult_prob_error")


def consistency_long(metrics_by_label: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Long table ``pairing, step, metric, value`` from each run's metrics (label = learner/sampler)."""
    frames = []
    for label, m in metrics_by_label.items():
        cols = [c for c in CONSISTENCY_METRICS if c in m.columns]
        if not cols or "step" not in m.columns:
            continue
        long = m[["step", *cols]].melt(id_vars="step", var_name="metric", value_name="value")
        frames.append(long.assign(pairing=label))
    if not frames:
        return pd.DataFrame(columns=["pairing", "step", "metric", "value"])
    return pd.concat(frames, ignore_index=True)[["pairing", "step", "metric", "value"]]


def consistency_medians(long: pd.DataFrame) -> pd.DataFrame:
    """Median per pairing and metric over steps, with the number of steps behind it (``steps``)."""
    if long.empty:
        return pd.DataFrame(columns=["pairing", "steps", *CONSISTENCY_METRICS])
    med = long.pivot_table(index="pairing", columns="metric", values="value", aggfunc="median")
    med.insert(0, "steps", long.groupby("pairing")["step"].nunique())
    return med.reset_index()


# The injected faults break an MXFP8 weight sync (E8M0 scales, requantization): the precision a fault matrix ran.
FAULT_PRECISIONS = ("mxfp8",)


def pairing_precisions(table: pd.DataFrame) -> list[str]:
    """The precisions of a consistency table's learner x sampler pairings ('mxfp8 grid-fraction 0.5' ->
    mxfp8, 'bf16 kv-fp8' -> bf16 and kv-fp8)."""
    words = [
        w
        for col in ("learner", "sampler")
        if col in table
        for v in table[col].dropna()
        for w in str(v).split()
    ]
    return list(dict.fromkeys(w for w in words if w[0].isalpha() and w != "grid-fraction"))


# --------------------------------------------------------------------------------------------- weight sync
def sync_matrix(checks: pd.DataFrame) -> pd.DataFrame:
    """step x invariant: 1 passed, 0 failed, NaN not checked that step (``--check-sync first``)."""
    m = checks.assign(ok=checks["passed"].astype("float64")).pivot_table(
        index="step", columns="invariant", values="ok", aggfunc="min"
    )
    cols = [i for i in INVARIANTS if i in m.columns] + [c for c in m.columns if c not in INVARIANTS]
    return m.reindex(columns=cols).sort_index()


def sync_failures(checks: pd.DataFrame) -> pd.DataFrame:
    """Failed checks, first failing tensor named; empty when every check passed."""
    failed = checks[~checks["passed"].astype(bool)]
    cols = [c for c in ("step", "invariant", "first_failing_tensor", "detail") if c in failed.columns]
    out = failed[cols].copy()
    out.insert(2, "what", out["invariant"].map(INVARIANTS).fillna(""))
    return out.sort_values(["step", "invariant"], ignore_index=True)


def fault_grid(fm: pd.DataFrame) -> pd.DataFrame:
    """Long ``fault, check, caught, target`` table from ``fault_matrix.parquet``.

    ``mxperf faults`` writes one row per injected fault: the invariant it targets (``invariant``), whether it
    was caught and by which checks (``caught_by``, comma-separated). Each fault becomes one row per check
    I1..I7. A table already in long form (``fault, check, caught``) passes through.
    """
    if "caught_by" not in fm.columns:
        check = "check" if "check" in fm.columns else "invariant"
        out = fm[["fault", check, "caught"]].rename(columns={check: "check"}).assign(target=False)
        return out.astype({"caught": bool})
    rows = []
    for r in fm.itertuples():
        by = {c.strip() for c in str(r.caught_by or "").split(",") if c.strip()}
        for check in INVARIANTS:
            rows.append(
                {
                    "fault": r.fault,
                    "check": check,
                    "caught": check in by,
                    "target": check == getattr(r, "invariant", None),
                }
            )
    return pd.DataFrame(rows, columns=["fault", "check", "caught", "target"])


def sync_when(step: object) -> str:
    """``first_caught_step`` in words: -1 is the initial sync (before the first step), null is never."""
    if step is None or pd.isna(step):
        return "never"
    return "initial sync (before step 0)" if int(step) < 0 else f"sync after step {int(step)}"


def fault_table(fm: pd.DataFrame) -> pd.DataFrame:
    """``fault_matrix.parquet`` for people: which check each fault targets, which caught it and when, and
    whether the run still completed (``silent``: the fault raised no error of its own)."""
    cols = {
        "fault": "fault",
        "invariant": "targets",
        "caught_by": "caught by",
        "first_caught_step": "first caught",
        "silent": "run completed anyway",
        "kl_k3_fault": "KL k3 with fault",
        "kl_k3_clean": "KL k3 clean",
        "error": "error",
    }
    out = fm[[c for c in cols if c in fm.columns]].rename(columns=cols)
    if "first caught" in out:
        out["first caught"] = fm["first_caught_step"].map(sync_when)
    if "caught by" in out:
        out["caught by"] = out["caught by"].fillna("").replace("", "nothing")
    return out


def _sync_name(step: int) -> str:
    return "the initial sync" if step < 0 else f"step {step}"


def sync_verdict(checks: pd.DataFrame) -> str:
    """'all 140 checks passed over 20 steps' or 'I1 (grid identity) failed at step 3 on ...'."""
    syncs = checks["step"].nunique()
    failed = sync_failures(checks)
    if failed.empty:
        return f"All {len(checks)} checks passed over {syncs} syncs."
    first = failed.iloc[0]
    tensor = first.get("first_failing_tensor")
    where = f" on tensor {tensor}" if isinstance(tensor, str) and tensor else ""
    return (
        f"{len(failed)} of {len(checks)} checks failed; first: {first['invariant']} "
        f"({INVARIANTS.get(first['invariant'], '?')}) at {_sync_name(int(first['step']))}{where}."
    )
