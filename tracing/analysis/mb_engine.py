"""Micro-batch detection's signals read from the engine: each process's host items and launches, ordered there.

The same :class:`~tracing.analysis.mbsignals.Signals` as ``mbsignals.gather_signals`` builds from an event frame
(per process, host items in (start, row) order and launches in (launch start, row) order, per-name flags once per
distinct name), here from the engine's ``events`` view and ``ops`` table (:mod:`tracing.analysis.gpu_tables`):
the sort happens in the engine, and numpy gets ordered columns a batch at a time.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from tracing.analysis.engine import batches
from tracing.analysis.mbsignals import Signals, is_op_range, is_optimizer, make_process, name_signals
from tracing.outputs import schema

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

_ROWS = 1 << 17
_LAUNCH_KINDS = ", ".join(f"'{k}'" for k in schema.LAUNCH_KINDS)


def engine_signals(con: duckdb.DuckDBPyConnection, gemm_kernels: list[str]) -> Signals:
    """Per-process signals of the trace in the engine (``gemm_kernels``: the kernel names classed ``gemm``)."""
    import pyarrow as pa

    names = [
        r[0]
        for r in con.sql("select distinct name from events where name is not null order by name").fetchall()
    ]
    shape_cats = [""] + [
        r[0]
        for r in con.sql("select distinct shapes from events where shapes <> '' order by shapes").fetchall()
    ]
    sig = name_signals(names, shape_cats)
    con.register(
        "signal_names",
        pa.table(
            {
                "name": pa.array(names, pa.string()),
                "code": np.arange(len(names), dtype=np.int64),
                "op_range": np.array([is_op_range(n) for n in names], bool),
                "optimizer": np.array([is_optimizer(n) for n in names], bool),
            }
        ),
    )
    con.register(
        "signal_shapes",
        pa.table(
            {"shape": pa.array(shape_cats, pa.string()), "code": np.arange(len(shape_cats), dtype=np.int64)}
        ),
    )
    con.register("gemm_kernels", pa.table({"name": pa.array(gemm_kernels, pa.string())}))
    try:
        host_filter = f"""(e.kind = '{schema.CPU_OP}' or e.kind in ({_LAUNCH_KINDS})
            or (e.kind = '{schema.RANGE}' and coalesce(n.op_range, false)))"""
        pids = {
            int(r[0])
            for r in con.sql(
                f"""select distinct e.pid from events e left join signal_names n on e.name = n.name
                where {host_filter} union select distinct pid from ops where launch_start_ns <> -1"""
            ).fetchall()
        }
        host = _grouped(
            con,
            f"""select e.pid, e.tid, e.start_ns as start, e.start_ns + e.dur_ns as "end", n.code,
              coalesce(s.code, 0) as shape, e.kind in ({_LAUNCH_KINDS}) as is_call
            from events e join signal_names n on e.name = n.name left join signal_shapes s on e.shapes = s.shape
            where {host_filter} order by e.pid, e.start_ns, e.row""",
        )
        launches = _grouped(
            con,
            f"""select o.pid, o.launch_tid as l_tid, o.launch_start_ns as l_start, o.launch_end_ns as l_end,
              o.end_ns as op_end, o.kind = '{schema.KERNEL}' as l_kernel,
              o.kind = '{schema.KERNEL}' and g.name is not null as l_gemm
            from ops o left join gemm_kernels g on o.name = g.name
            where o.launch_start_ns <> -1 order by o.pid, o.launch_start_ns, o.row""",
        )
        opt = _grouped(
            con,
            f"""select e.pid, e.start_ns as start, e.start_ns + e.dur_ns as "end" from events e
            join signal_names n on e.name = n.name where e.kind = '{schema.RANGE}' and n.optimizer
            order by e.pid, e.start_ns, e.row""",
        )
    finally:
        for t in ("signal_names", "signal_shapes", "gemm_kernels"):
            con.unregister(t)
    empty = {
        "tid": np.zeros(0, np.int64),
        "start": np.zeros(0, np.int64),
        "end": np.zeros(0, np.int64),
        "code": np.zeros(0, np.int64),
        "shape": np.zeros(0, np.int64),
        "is_call": np.zeros(0, bool),
    }
    for p in sorted(pids):
        o = opt.get(p)
        sig.processes[p] = make_process(
            p,
            host.get(p, empty),
            launches.get(p),
            o["start"] if o else np.zeros(0, np.int64),
            o["end"] if o else np.zeros(0, np.int64),
        )
    return sig


def _grouped(con: duckdb.DuckDBPyConnection, sql: str) -> dict[int, dict[str, np.ndarray]]:
    """A query's rows (ordered by pid first) as per-pid column arrays (without ``pid``)."""
    parts: list[pa.RecordBatch] = list(batches(con, sql, _ROWS))
    if not parts:
        return {}
    import pyarrow as pa

    t = pa.Table.from_batches(parts)
    if t.num_rows == 0:
        return {}
    cols = {c: t[c].to_numpy() for c in t.column_names}
    pid = cols.pop("pid")
    cut = np.flatnonzero(pid[1:] != pid[:-1]) + 1
    bounds = np.r_[0, cut, len(pid)]
    return {int(pid[a]): {c: v[a:b] for c, v in cols.items()} for a, b in itertools.pairwise(bounds)}
