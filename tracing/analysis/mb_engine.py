"""Micro-batch detection's signals read from the engine: each process's host items and launches, ordered there.

Per process, its host items (Kineto ``cpu_op`` and launch calls; nsys launch calls and ``emit_nvtx`` op ranges)
in (start, row) order and its GPU launches in (launch start, row) order, with per-name flags made once per
distinct name (``mbsignals.name_signals``). The engine sorts them into two tables, and detection reads a
block of a region, or a micro-batch's neighbourhood, at a time (:class:`EngineItems`): a process holds at most a
slab of :data:`SLAB_ITEMS` items, however large the trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing.analysis.gpu_tables import grouped
from tracing.analysis.mbsignals import (
    Process,
    Signals,
    is_op_range,
    is_optimizer,
    make_process,
    name_signals,
)
from tracing.ingest.engine import arrow, batches
from tracing.outputs import schema

if TYPE_CHECKING:
    import duckdb

SLAB_ITEMS = 1 << 17  # host items (and launches) a process holds at a time
_EVERY = 1 << 10  # items per entry of an engine-read process's start index
_LAUNCH_KINDS = ", ".join(f"'{k}'" for k in schema.LAUNCH_KINDS)
_HOST_COLUMNS = 'tid, start, "end", code, shape'
_LAUNCH_COLUMNS = "l_tid, l_start, l_end, op_start, op_end, prev_end, l_kernel, l_gemm"


def engine_signals(con: duckdb.DuckDBPyConnection, gemm_kernels: list[str]) -> Signals:
    """Per-process signals of the trace in the engine (``gemm_kernels``: the kernel names classed ``gemm``).
    The engine's ``host_items`` and ``launch_items`` tables (not temporary: :class:`EngineItems` reads them
    through cursors) stay until it closes."""
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
    host = f"""(e.kind = '{schema.CPU_OP}' or e.kind in ({_LAUNCH_KINDS})
        or (e.kind = '{schema.RANGE}' and coalesce(n.op_range, false)))"""
    try:
        # items in (pid, start, row) order by one parallel sort; i = the item's position in its process, read
        # from the rowid (insertion order) rather than a per-process window, which sorts each process alone
        con.execute(
            f"""create or replace temp table host_sorted as
            select e.pid, e.tid, e.start_ns as start, e.start_ns + e.dur_ns as "end", n.code,
              coalesce(s.code, 0) as shape
            from events e join signal_names n on e.name = n.name left join signal_shapes s on e.shapes = s.shape
            where {host} order by e.pid, e.start_ns, e.row"""
        )
        firsts = con.sql("select pid, min(rowid) from host_sorted group by pid").fetchall()
        first = " ".join(f"when {int(p)} then {int(f)}" for p, f in firsts)
        con.execute(
            f"""create or replace table host_items as
            select pid, rowid - {f"case pid {first} end" if firsts else "0"} as i, tid, start, "end", code, shape
            from host_sorted;
            drop table host_sorted;
            create or replace table launch_items as
            with unlaunched as (  -- ops whose launch the trace lacks (queued before the capture began)
              select pid, start_ns as u_start, max(end_ns) over (partition by pid order by start_ns, row
                rows unbounded preceding) as u_end from ops where launch_start_ns = -1)
            select o.pid, row_number() over (partition by o.pid order by o.launch_start_ns, o.row) - 1 as i,
              o.launch_tid as l_tid, o.launch_start_ns as l_start, o.launch_end_ns as l_end,
              o.start_ns as op_start, o.end_ns as op_end,
              greatest(coalesce(max(o.end_ns) over (partition by o.pid order by o.launch_start_ns, o.row
                rows between unbounded preceding and 1 preceding), -1), coalesce(u.u_end, -1)) as prev_end,
              o.kind = '{schema.KERNEL}' as l_kernel,
              o.kind = '{schema.KERNEL}' and g.name is not null as l_gemm
            from ops o left join gemm_kernels g on o.name = g.name
              asof left join unlaunched u on o.pid = u.pid and o.start_ns > u.u_start
            where o.launch_start_ns <> -1 order by o.pid, o.launch_start_ns, o.row"""
        )
        nameless = con.sql(
            f"""select distinct e.pid from events e left join signal_names n on e.name = n.name
            where {host}"""
        ).fetchall()
        optimizer = f"""select e.pid, e.start_ns as start, e.start_ns + e.dur_ns as "end" from events e
            join signal_names n on e.name = n.name where e.kind = '{schema.RANGE}' and n.optimizer
            order by e.pid, e.start_ns, e.row"""
        opt = grouped(arrow(con, optimizer), ("pid",))
    finally:
        for t in ("signal_names", "signal_shapes", "gemm_kernels"):
            con.unregister(t)
    items = con.sql(
        "select distinct pid from host_items union select distinct pid from launch_items"
    ).fetchall()
    for p in sorted({int(r[0]) for r in nameless} | {int(r[0]) for r in items}):
        o = opt.get((p,), {"start": np.zeros(0, np.int64), "end": np.zeros(0, np.int64)})
        sig.processes[p] = EngineItems(con, p, o["start"], o["end"])
    return sig


class EngineItems:
    """A process's host items and launches read from the engine: a region a block at a time, a window as a
    :class:`~tracing.analysis.mbsignals.Process` (which serves detection the same way). Detection moves forward in time, so a
    slab of :data:`SLAB_ITEMS` items from the last request on is held and serves the requests it covers."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, pid: int, opt_start: np.ndarray, opt_end: np.ndarray
    ) -> None:
        self.con, self.pid = con, pid
        self.opt_start, self.opt_end = opt_start, opt_end
        self._slab: Process | None = None
        self._covers = (0, -1)  # every item starting in [lo, hi] is in the slab
        # every EVERY-th item's start (item i = its position in start order): where a slab from t on begins;
        # made when a slab is needed past the first (a process of at most SLAB_ITEMS items never needs one)
        self._index: dict[str, np.ndarray] = {}

    def host_blocks(
        self, lo: int, hi: int, columns: tuple[str, ...], size: int
    ) -> Iterator[dict[str, np.ndarray]]:
        slab = self._held(lo, hi)
        if slab is not None:
            return slab.host_blocks(lo, hi, columns, size)
        return self._blocks("host_items", "start", lo, hi, columns, size)

    def launch_blocks(
        self, lo: int, hi: int, columns: tuple[str, ...], size: int
    ) -> Iterator[dict[str, np.ndarray]]:
        slab = self._held(lo, hi)
        if slab is not None:
            return slab.launch_blocks(lo, hi, columns, size)
        return self._blocks("launch_items", "l_start", lo, hi, columns, size)

    def window(self, lo: int, hi: int) -> Process:
        slab = self._held(lo, hi)
        if slab is not None:
            return slab.window(lo, hi)
        p = [self.pid, lo, hi]
        where = "where pid = $1 and {} between $2 and $3 order by rowid"
        host = _columns(arrow(self.con, f"select {_HOST_COLUMNS} from host_items {where.format('start')}", p))
        lau = _columns(
            arrow(self.con, f"select {_LAUNCH_COLUMNS} from launch_items {where.format('l_start')}", p)
        )
        return make_process(self.pid, host, lau, self.opt_start, self.opt_end)

    def _held(self, lo: int, hi: int) -> Process | None:
        """The held slab when it covers [lo, hi] (the first from the process's first item; later ones from ``lo``
        on when the current one does not cover it)."""
        a, b = self._covers
        if not (a <= lo and hi <= b):
            t = None if self._slab is None else lo
            host = self._slab_from("host_items", "start", _HOST_COLUMNS, t)
            lau = self._slab_from("launch_items", "l_start", _LAUNCH_COLUMNS, t)
            end = np.iinfo(np.int64).max
            for col, n in ((host["start"], len(host["start"])), (lau["l_start"], len(lau["l_start"]))):
                if n == SLAB_ITEMS:  # cut: items starting at its last start may go on past it
                    end = min(end, int(col[-1]) - 1)
            self._slab = make_process(self.pid, host, lau, self.opt_start, self.opt_end)
            self._covers = (np.iinfo(np.int64).min if t is None else lo, end)
            a, b = self._covers
        return self._slab if a <= lo and hi <= b else None

    def _slab_from(self, table: str, key: str, columns: str, t: int | None) -> dict[str, np.ndarray]:
        """:data:`SLAB_ITEMS` items of ``table`` in start order, from a little before the first starting at t
        (None: from the first)."""
        first = 0
        if t is not None:
            if table not in self._index:
                sql = f"select {key} from {table} where pid = $1 and i % {_EVERY} = 0 order by i"
                self._index[table] = arrow(self.con, sql, [self.pid])[key].to_numpy()
            first = max(int(np.searchsorted(self._index[table], t, side="left")) - 1, 0) * _EVERY
        sql = f"select {columns} from {table} where pid = $1 and i >= $2 and i < $3 order by i"
        return _columns(arrow(self.con, sql, [self.pid, first, first + SLAB_ITEMS]))

    def _blocks(
        self, table: str, key: str, lo: int, hi: int, columns: tuple[str, ...], size: int
    ) -> Iterator[dict[str, np.ndarray]]:
        cols = ", ".join(f'"{c}"' for c in columns)
        sql = f"select {cols} from {table} where pid = $1 and {key} between $2 and $3 order by rowid"
        cursor = self.con.cursor()  # its own result: detection reads two of these side by side
        try:
            for b in batches(cursor, sql, size, [self.pid, lo, hi]):
                yield {c: b.column(i).to_numpy(zero_copy_only=False) for i, c in enumerate(columns)}
        finally:
            cursor.close()

    def whole(self) -> tuple[int, int, int] | None:
        """(busiest thread, first host item start, last host item end): a process's fallback region (its
        busiest thread is the one with most launches, else most host items; the smallest tid among equals)."""
        span = self.con.sql(
            'select min(start), max("end") from host_items where pid = $1', params=[self.pid]
        ).fetchall()[0]
        if span[0] is None:
            return None
        launched = self.con.sql(
            "select count(*) from launch_items where pid = $1", params=[self.pid]
        ).fetchall()
        table, col = ("launch_items", "l_tid") if launched[0][0] else ("host_items", "tid")
        tid = self.con.sql(
            f"select {col} from {table} where pid = $1 group by {col} order by count(*) desc, {col} limit 1",
            params=[self.pid],
        ).fetchall()[0][0]
        return int(tid), int(span[0]), int(span[1])


def _columns(t: Any) -> dict[str, np.ndarray]:
    return {c: t[c].to_numpy(zero_copy_only=False) for c in t.column_names}
