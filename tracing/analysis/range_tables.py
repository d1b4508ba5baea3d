"""The range table in SQL: nesting, names, phases and the GPU work each range caused, for a trace of any size.

The rules are drawn in :mod:`tracing.analysis.attribution`. Here, over the engine's ``events`` view and the
``ops`` / ``op_gaps`` tables (:mod:`tracing.analysis.gpu_tables`):

- ``ranges``: the trace's range events in table order (start ascending, end descending, then event row), with
  ``range_id`` = that position; parent and depth by containment per thread (:class:`attribution.Nesting`, fed a
  batch of ranges at a time: a stack walk is no relational operation); each distinct name split, encoded and
  mapped to its phase once (:class:`attribution.NameValues`);
- per rule (``thread``: launched on the range's own thread; ``window``: on any thread of its process), the ops
  whose launch call started in [start, end]: an interval join on a (group, time) key, then count, first start,
  last end and the |union| of the ops' intervals per range;
- the window (start -> later of end and the last GPU op launched inside it) and the device busy union and host
  stall inside it: C(t) = covered time before t of the process's merged intervals, read at both window edges
  through an as-of join on the cumulative lengths.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing.analysis import shapes
from tracing.analysis.engine import OFFSET, arrow, batches
from tracing.analysis.phases import PhaseMap
from tracing.outputs import schema

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

NEST_ROWS = 1 << 16
NO_GPU_REASON = "trace has no GPU ops (kernel/memcpy/memset)"
RANGELOG_REASON = "mxperf range log: host clock only, no GPU activity recorded"
_ENCODED = re.compile(r"^(?P<name>[^\[\]]+)\[(?P<attrs>[^\[\]]*)\]$")


def split_encoded_name(name: str) -> tuple[str, dict[str, object]]:
    """``update/microbatch[step=3,microbatch=1]`` -> ("update/microbatch", {"step": 3, "microbatch": 1}).

    The range helper encodes attributes this way when ``encode_attrs`` is on; numbers are decoded.
    """
    m = _ENCODED.match(name)
    if not m or "=" not in m.group("attrs"):
        return name, {}
    attrs: dict[str, object] = {}
    for part in m.group("attrs").split(","):
        key, sep, value = part.partition("=")
        if not sep:
            return name, {}
        attrs[key.strip()] = _number(value.strip())
    return m.group("name"), attrs


def _number(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


class Nesting:
    """Ranges nest per (pid, tid) by containment: fed in table order (start ascending, end descending) a block at
    a time, each range's parent and depth, the threads' open ranges carried from block to block. A range flagged
    in ``mark`` marks its ancestors (its thread's open ranges): :attr:`marked` lists each ancestor once (one
    marked has its own ancestors marked already, so the walk stops there)."""

    def __init__(self) -> None:
        self.n = 0
        self.marked: list[int] = []
        self._stacks: dict[tuple[int, int], list[list[int]]] = {}  # per thread: [index, end, marked]

    def add(
        self,
        pid: np.ndarray,
        tid: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        mark: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        m = len(pid)
        parent = np.full(m, schema.NO_ID, np.int64)
        depth = np.zeros(m, np.int32)
        marks = itertools.repeat(False) if mark is None else mark.tolist()
        rows = zip(*(np.asarray(x).tolist() for x in (pid, tid, start, end)), marks, strict=False)
        stacks, marked = self._stacks, self.marked
        for i, (p, t, s0, e0, flagged) in enumerate(rows):
            stack = stacks.setdefault((p, t), [])
            while stack and (stack[-1][1] <= s0 or stack[-1][1] < e0):
                stack.pop()
            if stack:
                parent[i] = stack[-1][0]
                depth[i] = len(stack)
                if flagged:
                    for entry in reversed(stack):
                        if entry[2]:
                            break
                        entry[2] = 1
                        marked.append(entry[0])
            stack.append([self.n + i, e0, 0])
        self.n += m
        return parent, depth


class NameValues:
    """Per distinct range name, in the order added: its base name, attributes (JSON) and phase. Names are split,
    JSON-encoded and mapped to phases once per distinct name, phases once per op name (emit_nvtx names differ
    by their suffixes, ``, op_id = 7``, only)."""

    def __init__(self, phase_map: PhaseMap) -> None:
        self.phase_map = phase_map
        self.names: list[str] = []
        self.attrs: list[str] = []
        self.phases: list[str] = []
        self._phase_of_op: dict[str, str] = {}

    def add(self, name: str) -> None:
        base, parsed = split_encoded_name(name)
        op = shapes.base_op_name(base)
        phase = self._phase_of_op.get(op)
        if phase is None:
            phase = self._phase_of_op[op] = self.phase_map.phase_of(op)
        self.names.append(base)
        self.attrs.append(json.dumps(parsed, sort_keys=True) if parsed else "{}")
        self.phases.append(phase)


RANGES_SQL = """
create or replace temp table ranges as
select (row_number() over (order by start_ns, start_ns + dur_ns desc, row) - 1)::bigint as range_id,
  pid, tid, start_ns, start_ns + dur_ns as end_ns, coalesce(name, '') as name, coalesce(domain, '') as domain
from events where kind = 'range'
"""


def _attribution_sql(by_thread: bool) -> str:
    """Per range, the ops launched in it by the rule: n, busy (|union|), first start, last end.

    In a group's (launch start, row) order a range's ops are one slice [lo, hi): both ends come from as-of joins
    on a unique (launch start, position) key, and the slice's positions are matched to the ops by equality."""
    keys = "pid, tid" if by_thread else "pid"
    op_on = "o.pid = g.pid and o.launch_tid = g.tid" if by_thread else "o.pid = g.pid"
    r_on = "r.pid = g.pid and r.tid = g.tid" if by_thread else "r.pid = g.pid"
    return f"""
with g as (select {keys}, (row_number() over ())::bigint as gid from (select distinct {keys} from ranges)),
n as (select g.gid, o.launch_start_ns as t, o.start_ns as s, o.end_ns as e,
        row_number() over (partition by g.gid order by o.launch_start_ns, o.row) - 1 as pos
      from ops o join g on {op_on} where o.launch_start_ns <> -1),
o as (select *, ((t::hugeint + {OFFSET}) << 40) + pos as k from n),
q as (select r.range_id, g.gid, (r.start_ns::hugeint + {OFFSET}) << 40 as ks,
        (r.end_ns::hugeint + {OFFSET} + 1) << 40 as ke
      from ranges r join g on {r_on}),
lo as (select q.range_id, q.gid, coalesce(o.pos + 1, 0) as lo from q asof left join o on q.gid = o.gid and o.k < q.ks),
hi as (select q.range_id, coalesce(o.pos + 1, 0) as hi from q asof left join o on q.gid = o.gid and o.k < q.ke),
p as (select range_id, gid, unnest(range(lo, hi)) as pos from lo join hi using (range_id) where hi > lo),
j as (select p.range_id, o.s, o.e from p join o on o.gid = p.gid and o.pos = p.pos),
w as (select range_id, s, e, max(e) over (partition by range_id order by s, e
      rows between unbounded preceding and 1 preceding) as pr from j)
select range_id, count(*) as n,
  sum(case when pr is null then e - s else greatest(e, pr) - greatest(s, pr) end)::bigint as busy,
  min(s) as first, max(e) as last
from w group by range_id
"""


# per process, the union of its devices' intervals with each block's covered time before it
_COVER_SQL = """
create or replace temp table {name}_cover as
with x as (select pid, s, e, max(e) over (partition by pid order by s, e
           rows between unbounded preceding and 1 preceding) as pr from ({source})),
b as (select pid, s, e, sum(case when pr is null or s > pr then 1 else 0 end) over (partition by pid order by s, e
      rows unbounded preceding) as block from x),
u as (select pid, min(s) as bs, max(e) as be from b group by pid, block)
select pid, bs, be, coalesce(sum(be - bs) over (partition by pid order by bs
  rows between unbounded preceding and 1 preceding), 0)::bigint as before from u
"""


def _covered(name: str, column: str) -> str:
    """C(t) at each range's ``column``: covered time of ``name``'s intervals before t."""
    return f"""(select q.range_id, coalesce(u.before + greatest(least(q.t, u.be) - u.bs, 0), 0) as c
    from (select range_id, pid, {column} as t from range_window) q
    asof left join {name}_cover u on q.pid = u.pid and u.bs <= q.t)"""


TABLE_SQL = f"""
select w.range_id, w.window_end_ns - w.start_ns as time_ns,
  coalesce(th.n, 0) as thread_ops, coalesce(th.busy, 0) as thread_busy_ns,
  coalesce(th.last - th.first, 0) as thread_span_ns,
  coalesce(wi.n, 0) as window_ops, coalesce(wi.busy, 0) as window_busy_ns,
  coalesce(wi.last - wi.first, 0) as window_span_ns,
  case when wi.n > 0 then wi.last end as gpu_end_ns,
  bh.c - bl.c as busy_in_window_ns, sh.c - sl.c as host_stall_ns
from range_window w left join thread_ops th using (range_id) left join window_ops wi using (range_id)
  join {_covered("busy", "window_end_ns")} bh using (range_id) join {_covered("busy", "start_ns")} bl using (range_id)
  join {_covered("stall", "window_end_ns")} sh using (range_id)
  join {_covered("stall", "start_ns")} sl using (range_id)
order by w.range_id
"""


def make_ranges(con: duckdb.DuckDBPyConnection) -> int:
    """The ``ranges`` table (in table order); returns the number of ranges."""
    con.execute(RANGES_SQL)
    return int(con.sql("select count(*) from ranges").fetchall()[0][0])


def range_table(con: duckdb.DuckDBPyConnection, phase_map: PhaseMap, source: str, num_ops: int) -> pa.Table:
    """The range table (``schema.RANGE_COLUMNS`` without trace / rank) in table order, GPU work attributed when
    the trace has GPU ops (``num_ops``), else null with ``gpu_reason``."""
    import pyarrow as pa

    nest = _nesting(con)
    names = _name_values(con, phase_map)
    con.register("range_nesting", nest)
    con.register("range_names", names)
    base = arrow(
        con,
        """select r.range_id, n.parent_id, n.depth, v.base as name, r.domain, v.phase, r.pid, r.tid, r.start_ns,
        r.end_ns, r.end_ns - r.start_ns as wall_ns, v.attrs
        from ranges r join range_nesting n using (range_id) join range_names v on r.name = v.name
        order by r.range_id""",
    )
    con.unregister("range_nesting")
    con.unregister("range_names")
    n = base.num_rows
    cols: dict[str, Any] = {"source": pa.array([source] * n, pa.string())}
    for c in base.column_names:
        cols[c] = base[c]
    if num_ops:
        gpu = _attributed(con)
        for c in gpu.column_names[1:]:
            cols[c] = gpu[c]
        reason = ""
    else:
        cols["time_ns"] = base["wall_ns"]
        reason = NO_GPU_REASON
    cols["gpu_reason"] = pa.array([reason] * n, pa.string())
    out = {}
    for c, dtype in schema.RANGE_COLUMNS.items():
        if c in ("trace", "rank"):
            continue
        col = cols.get(c)
        if col is None:
            col = pa.nulls(n, pa.int64())
        out[c] = col.cast(pa.string() if dtype == "string" else pa.int64())
    return pa.table(out)


def _attributed(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """The GPU columns of every range (by range_id)."""
    con.execute(f"create or replace temp table thread_ops as {_attribution_sql(True)}")
    con.execute(f"create or replace temp table window_ops as {_attribution_sql(False)}")
    con.execute(
        """create or replace temp table range_window as
        select r.range_id, r.pid, r.start_ns,
          case when w.n > 0 then greatest(r.end_ns, w.last) else r.end_ns end as window_end_ns
        from ranges r left join window_ops w using (range_id)"""
    )
    busy = "select pid, min(s) as s, max(e) as e from (select pid, device, s, e, sum(case when s > g0 then 1 else 0 end) over (partition by pid, device order by k rows unbounded preceding) as block from op_gaps) group by pid, device, block"
    stall = (
        "select pid, g0 as s, least(s, le) as e from op_gaps where s > g0 and le <> -1 and least(s, le) > g0"
    )
    con.execute(_COVER_SQL.format(name="busy", source=busy))
    con.execute(_COVER_SQL.format(name="stall", source=stall))
    return arrow(con, TABLE_SQL)


def _nesting(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """(range_id, parent_id, depth) of every range, a batch of ranges at a time in table order."""
    import pyarrow as pa

    nesting = Nesting()
    parents, depths = [], []
    sql = "select pid, tid, start_ns, end_ns from ranges order by range_id"
    for b in batches(con, sql, NEST_ROWS):
        parent, depth = nesting.add(*(b.column(i).to_numpy() for i in range(4)))
        parents.append(parent)
        depths.append(depth.astype(np.int64))
    parent = np.concatenate(parents) if parents else np.zeros(0, np.int64)
    depth = np.concatenate(depths) if depths else np.zeros(0, np.int64)
    return pa.table({"range_id": np.arange(len(parent), dtype=np.int64), "parent_id": parent, "depth": depth})


def _name_values(con: duckdb.DuckDBPyConnection, phase_map: PhaseMap) -> pa.Table:
    """Each distinct range name's base name, attributes (JSON) and phase, made once per name."""
    import pyarrow as pa

    names = [r[0] for r in con.sql("select distinct name from ranges").fetchall()]
    values = NameValues(phase_map)
    for name in names:
        values.add(name)
    return pa.table(
        {
            "name": pa.array(names, pa.string()),
            "base": pa.array(values.names, pa.string()),
            "attrs": pa.array(values.attrs, pa.string()),
            "phase": pa.array(values.phases, pa.string()),
        }
    )
