"""Per-device and per-stream GPU metrics, the kernel table and the device timelines, in SQL over one trace's events.

The rules (launch-end host stall, HTA's per-stream rule) are docs/tracing.md's; this module computes them in
the engine (:mod:`tracing.ingest.engine`) over a view ``events`` (the event table, ``kind`` / ``name`` as
text, plus ``row``: the row's position in the table), for a trace of any size:

- ``ops``: kernel / memcpy / memset rows with their launch call joined by (pid, correlation), the first launch
  record in table order winning a duplicated key (launch columns -1 without one);
- ``op_gaps``: each (pid, device)'s ops in (start, launch end, row) order with the running maximum end before
  each op (``g0``): an op that starts after it opens a gap [g0, start) of the busy union;
- devices, streams, kernels and the busy / stall intervals are aggregates of those two.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing.analysis.intervals import Intervals
from tracing.ingest.engine import arrow
from tracing.outputs import schema

if TYPE_CHECKING:
    import duckdb
    import pandas as pd
    import pyarrow as pa

KERNEL_WAIT_THRESHOLD_NS = 30_000  # HTA's consecutive_kernel_delay (30, in trace units = us)
_KINDS = ", ".join(f"'{k}'" for k in schema.GPU_OP_KINDS)
_LAUNCHES = ", ".join(f"'{k}'" for k in schema.LAUNCH_KINDS)
# ops without a launch record sort after those with one at the same start
_LAUNCH_KEY = "case when launch_end_ns = -1 then 9223372036854775807 else launch_end_ns end"


@dataclass(frozen=True)
class DeviceTimeline:
    """The busy union and the host-stall intervals of one (process, device), and its row of
    ``schema.DEVICE_COLUMNS`` before the colocated ones."""

    pid: int
    device: int
    busy: Intervals
    stall: Intervals  # each lies inside a gap of the busy union, from its start
    row: dict[str, float | int]


OPS_SQL = f"""
create or replace temp table launches as
select pid, correlation, arg_min(start_ns, row) as launch_start_ns,
  arg_min(start_ns + dur_ns, row) as launch_end_ns, arg_min(tid, row) as launch_tid
from events where kind in ({_LAUNCHES}) and correlation >= 0 group by pid, correlation;
create or replace temp table ops as
select o.row, o.kind, o.name, o.pid, o.device, o.stream, o.start_ns, o.dur_ns, o.correlation,
  o.start_ns + o.dur_ns as end_ns,
  coalesce(l.launch_start_ns, -1) as launch_start_ns, coalesce(l.launch_end_ns, -1) as launch_end_ns,
  coalesce(l.launch_tid, -1) as launch_tid
from events o left join launches l on o.correlation >= 0 and o.pid = l.pid and o.correlation = l.correlation
where o.kind in ({_KINDS});
create or replace temp table op_gaps as
with ordered as (
  select pid, device, stream, kind, row, start_ns as s, end_ns as e, launch_start_ns as ls, launch_end_ns as le,
    row_number() over w as k, max(end_ns) over (w rows between unbounded preceding and current row) as run_end
  from ops window w as (partition by pid, device order by start_ns, {_LAUNCH_KEY}, row)
)
select *, lag(run_end) over (partition by pid, device order by k) as g0 from ordered;
"""

DEVICES_SQL = """
with x as (
  select *, s > g0 as is_gap,
    case when s > g0 and le <> -1 then greatest(least(s, le) - g0, 0) else 0 end as stall
  from op_gaps
), overlap as (
  select pid, device, sum(case when pe is null then 0 else greatest(least(pe, end_ns) - start_ns, 0) end)
    as same_stream_overlap_ns
  from (select pid, device, start_ns, end_ns,
          lag(end_ns) over (partition by pid, device, stream order by start_ns, row) as pe from ops)
  group by pid, device
)
select x.pid, x.device, min(s) as first_ns, max(e) as last_ns, max(e) - min(s) as span_ns,
  (max(e) - min(s) - coalesce(sum(s - g0) filter (is_gap), 0))::bigint as busy_ns,
  coalesce(sum(s - g0) filter (is_gap), 0)::bigint as idle_ns, sum(stall)::bigint as host_stall_ns,
  coalesce(sum(stall) filter (is_gap and le <> -1 and ls <= g0), 0)::bigint as host_stall_ambiguous_ns,
  coalesce(sum(s - g0) filter (is_gap and le = -1), 0)::bigint as unattributed_ns,
  (coalesce(sum(s - g0) filter (is_gap), 0) - sum(stall))::bigint as other_idle_ns,
  null::double as host_stall_fraction,
  count(*) filter (kind = 'kernel') as num_kernels, count(*) filter (kind = 'memcpy') as num_memcpy,
  count(*) filter (kind = 'memset') as num_memset, count(distinct stream) as num_streams,
  coalesce(any_value(overlap.same_stream_overlap_ns), 0)::bigint as same_stream_overlap_ns
from x join overlap using (pid, device)
group by x.pid, x.device order by x.pid, x.device
"""

BUSY_SQL = """
select pid, device, min(s) as s, max(e) as e from (
  select pid, device, s, e, sum(case when s > g0 then 1 else 0 end) over (partition by pid, device order by k
    rows unbounded preceding) as block from op_gaps)
group by pid, device, block order by pid, device, s
"""

STALL_SQL = """
select pid, device, g0 as s, least(s, le) as e from op_gaps
where s > g0 and le <> -1 and least(s, le) > g0 order by pid, device, g0
"""

STREAMS_SQL = """
with o as (
  select pid, device, stream, start_ns as s, end_ns as e,
    case when $rule = 'start' then launch_start_ns else launch_end_ns end as l,
    lag(end_ns) over w as pe, max(end_ns) over (w rows between unbounded preceding and 1 preceding) as pr
  from ops window w as (partition by pid, device, stream order by start_ns, end_ns, row)
), x as (
  select *, greatest(s - pe, 0) as gap, l <> -1 and l > pe as host from o
)
select pid, device, stream, count(*) as num_ops, max(e) - min(s) as span_ns,
  sum(case when pr is null then e - s else greatest(e, pr) - greatest(s, pr) end)::bigint as busy_ns,
  coalesce(sum(gap), 0)::bigint as idle_ns,
  coalesce(sum(gap) filter (host), 0)::bigint as host_wait_ns,
  coalesce(sum(gap) filter (not host and gap < $threshold), 0)::bigint as kernel_wait_ns,
  coalesce(sum(gap) filter (not host and gap >= $threshold), 0)::bigint as other_wait_ns,
  count(*) filter (s - pe < 0) as negative_gaps
from x group by pid, device, stream order by pid, device, stream
"""

KERNELS_SQL = """
select device, kind, name, count(*) as count, sum(dur_ns)::bigint as total_ns, max(dur_ns) as max_ns
from ops where name is not null and kind is not null group by device, kind, name
order by device, total_ns desc, kind, name
"""


def make_ops(con: duckdb.DuckDBPyConnection) -> int:
    """The ``launches``, ``ops`` and ``op_gaps`` tables; returns the number of GPU ops."""
    con.execute(OPS_SQL)
    return int(con.sql("select count(*) from ops").fetchall()[0][0])


def ops_frame(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """The ``ops`` table as a frame in table order (``kind`` / ``name`` as str): what ``metrics.gpu_ops`` gives."""
    t = arrow(con, "select * exclude (row) from ops order by row")
    df = t.to_pandas()
    for c in ("kind", "name"):
        df[c] = df[c].astype(object)
    return df


def device_timelines(con: duckdb.DuckDBPyConnection) -> list[DeviceTimeline]:
    """One :class:`DeviceTimeline` per (process, device), in (pid, device) order."""
    busy = _by_device(arrow(con, BUSY_SQL))
    stall = _by_device(arrow(con, STALL_SQL))
    out = []
    for r in arrow(con, DEVICES_SQL).to_pylist():
        key = (r["pid"], r["device"])
        span = r["span_ns"]
        unknown = not span or stall_unmeasured(r["unattributed_ns"], r["idle_ns"], span)
        row = r | {"host_stall_fraction": float("nan") if unknown else r["host_stall_ns"] / span}
        out.append(DeviceTimeline(*key, busy.get(key, Intervals()), stall.get(key, Intervals()), row))
    return out


def _by_device(t: pa.Table) -> dict[tuple[int, ...], Intervals]:
    """Interval rows (pid, device, s, e) in (pid, device, s) order -> per (pid, device) :class:`Intervals`."""
    return {k: Intervals.of(c["s"], c["e"]) for k, c in grouped(t, ("pid", "device")).items()}


def grouped(t: pa.Table, keys: tuple[str, ...]) -> dict[tuple[int, ...], dict[str, np.ndarray]]:
    """A table's rows (ordered by ``keys`` first) as per key tuple arrays of its other columns."""
    if t.num_rows == 0:
        return {}
    cols = {c: t[c].to_numpy(zero_copy_only=False) for c in t.column_names}
    key = [cols.pop(k) for k in keys]
    cut = np.flatnonzero(np.any([k[1:] != k[:-1] for k in key], axis=0)) + 1
    bounds = np.r_[0, cut, len(key[0])]
    return {
        tuple(int(k[a]) for k in key): {c: v[a:b] for c, v in cols.items()}
        for a, b in itertools.pairwise(bounds)
    }


def stream_rows(
    con: duckdb.DuckDBPyConnection, rule: str = "start", threshold_ns: int = KERNEL_WAIT_THRESHOLD_NS
) -> pa.Table:
    """HTA's idle breakdown per (process, device, stream) (``schema.STREAM_COLUMNS`` without trace / rank)."""
    if rule not in ("start", "end"):
        raise ValueError(f"rule must be 'start' or 'end', got {rule!r}")
    t = con.sql(STREAMS_SQL, params={"rule": rule, "threshold": threshold_ns}).to_arrow_table()
    idle = t["idle_ns"].to_numpy()
    host = t["host_wait_ns"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(idle > 0, host / np.where(idle > 0, idle, 1), np.nan)
    t = t.add_column(t.schema.get_field_index("other_wait_ns") + 1, "host_wait_share", [share])
    cols = [c for c in schema.STREAM_COLUMNS if c not in ("trace", "rank")]
    return t.select(cols)


def kernel_groups(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """(device, kind, name, count, total_ns, max_ns) per kernel, rows by device, total time descending, then
    (kind, name) in code-point order."""
    return arrow(con, KERNELS_SQL)


def ops_before_launch(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """GPU ops that start before their launch call started -- impossible, so the trace's GPU and host clocks
    disagree (CUPTI / roctracer clock conversion, pytorch/kineto#1380) and host stall, which compares them,
    may be off by up to the largest lead: ``{"ops", "launched_ops", "max_lead_ns"}``, empty when none does."""
    n, lead, launched = con.sql(
        "select count(*) filter (launch_start_ns > start_ns), max(launch_start_ns - start_ns), count(*) "
        "from ops where launch_end_ns <> -1"
    ).fetchall()[0]
    return {"ops": int(n), "launched_ops": int(launched), "max_lead_ns": int(lead)} if n else {}


UNMEASURED_SHARE = 0.1


def stall_unmeasured(unattributed_ns: Any, idle_ns: Any, span_ns: Any) -> Any:
    """Whether a device's host stall is materially unmeasured (scalars or arrays, e.g. ``devices.parquet``
    columns): idle ending at GPU ops with no launch call in the trace (``unattributed_ns``) is at least a tenth of
    its idle and a hundredth of its span -- a few such ops are common; below that the figure stands."""
    u = np.asarray(unattributed_ns, np.float64)
    floor = UNMEASURED_SHARE * np.maximum(
        np.asarray(idle_ns, np.float64), UNMEASURED_SHARE * np.asarray(span_ns)
    )
    out = (u > 0) & (u >= floor)
    return bool(out) if out.ndim == 0 else out
