"""The range table in SQL: nesting, names, phases and the GPU work each range caused, for a trace of any size.

The rules are drawn in :mod:`tracing.analysis.attribution`. Here, over the engine's ``events`` view and the
``ops`` / ``op_gaps`` tables (:mod:`tracing.analysis.gpu_tables`):

- ``ranges``: the trace's range events in table order (start ascending, end descending, then event row), with
  ``range_id`` = that position; parent and depth by containment per thread (:class:`Nesting`, fed a
  batch of ranges at a time: a stack walk is no relational operation); each distinct name split, encoded and
  mapped to its phase once (:class:`NameValues`);
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
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from tracing.analysis import shapes
from tracing.analysis.gpu_tables import BUSY_SQL, STALL_SQL
from tracing.analysis.phases import PhaseMap
from tracing.ingest.engine import OFFSET, arrow, batches
from tracing.outputs import schema

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

NEST_ROWS = 1 << 16
NO_GPU_REASON = "trace has no GPU ops (kernel/memcpy/memset)"
RANGELOG_REASON = "mxperf range log: host clock only, no GPU activity recorded"
NO_LAUNCH_REASON = (
    "no launch call in the trace ties GPU work to this process: what a range launched is not measured"
)
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
create or replace table ranges as
select (row_number() over (order by start_ns, start_ns + dur_ns desc, row) - 1)::bigint as range_id,
  pid, tid, start_ns, start_ns + dur_ns as end_ns, coalesce(name, '') as name, coalesce(domain, '') as domain
from events where kind = 'range'
"""


def _attribution_sql(by_thread: bool) -> str:
    """Per range, the ops launched in it by the rule: n, busy (|union|), first start, last end.

    In a group's (launch start, row) order a range's ops are one slice [lo, hi): both ends come from one as-of
    join on a unique (launch start, position) key, and the slice's positions are matched to the ops by equality."""
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
x as (select range_id, gid, ks as k, false as is_end from q union all select range_id, gid, ke, true from q),
b as (select x.range_id, x.gid, max(coalesce(o.pos + 1, 0)) filter (where not x.is_end) as lo,
        max(coalesce(o.pos + 1, 0)) filter (where x.is_end) as hi
      from x asof left join o on x.gid = o.gid and o.k < x.k group by x.range_id, x.gid),
p as (select range_id, gid, unnest(range(lo, hi)) as pos from b where hi > lo),
j as (select p.range_id, o.s, o.e from p join o on o.gid = p.gid and o.pos = p.pos),
w as (select range_id, s, e, max(e) over (partition by range_id order by s, e
      rows between unbounded preceding and 1 preceding) as pr from j)
select range_id, count(*) as n,
  sum(case when pr is null then e - s else greatest(e, pr) - greatest(s, pr) end)::bigint as busy,
  min(s) as first, max(e) as last
from w group by range_id
"""


# per process, the union of its devices' intervals with each block's covered time before it (once per session)
_COVER_SQL = """
create temp table if not exists {name}_cover as
with x as (select pid, s, e, max(e) over (partition by pid order by s, e
           rows between unbounded preceding and 1 preceding) as pr from ({source})),
b as (select pid, s, e, sum(case when pr is null or s > pr then 1 else 0 end) over (partition by pid order by s, e
      rows unbounded preceding) as block from x),
u as (select pid, min(s) as bs, max(e) as be from b group by pid, block)
select pid, bs, be, coalesce(sum(be - bs) over (partition by pid order by bs
  rows between unbounded preceding and 1 preceding), 0)::bigint as before from u
"""
_COVER_SOURCES = {"busy": BUSY_SQL, "stall": STALL_SQL}  # the device table's busy blocks and host stalls


def _covered(name: str, windows: str) -> str:
    """C(hi) - C(lo) per window (``windows``: id, pid, lo, hi): ``name``'s covered time inside it, both edges
    read in one as-of join."""
    return f"""(select q.id, sum(q.sign * coalesce(u.before + greatest(least(q.t, u.be) - u.bs, 0), 0))::bigint
      as c
    from (select id, pid, hi as t, 1 as sign from {windows} union all select id, pid, lo, -1 from {windows}) q
    asof left join {name}_cover u on q.pid = u.pid and u.bs <= q.t group by q.id)"""


def window_stall(
    con: duckdb.DuckDBPyConnection, pid: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Host stall (ns) inside each window [lo, hi] of process ``pid`` (hi >= lo): the same measure as a
    range's ``host_stall_ns``."""
    import pyarrow as pa

    con.execute(_COVER_SQL.format(name="stall", source=_COVER_SOURCES["stall"]))
    con.register("stall_q", pa.table({"id": np.arange(len(pid)), "pid": pid, "lo": lo, "hi": hi}))
    try:
        got = arrow(con, f"select * from {_covered('stall', 'stall_q')} order by id")
    finally:
        con.unregister("stall_q")
    out = np.zeros(len(pid), np.int64)
    out[got.column("id").to_numpy()] = got.column("c").to_numpy()
    return out


_RANGE_WINDOWS = "(select range_id as id, pid, start_ns as lo, window_end_ns as hi from range_window)"
TABLE_SQL = f"""
select w.range_id, w.window_end_ns - w.start_ns as time_ns,
  coalesce(th.n, 0) as thread_ops, coalesce(th.busy, 0) as thread_busy_ns,
  coalesce(th.last - th.first, 0) as thread_span_ns,
  coalesce(wi.n, 0) as window_ops, coalesce(wi.busy, 0) as window_busy_ns,
  coalesce(wi.last - wi.first, 0) as window_span_ns,
  case when wi.n > 0 then wi.last end as gpu_end_ns,
  b.c as busy_in_window_ns, s.c as host_stall_ns
from range_window w left join thread_ops th using (range_id) left join window_ops wi using (range_id)
  join {_covered("busy", _RANGE_WINDOWS)} b on b.id = w.range_id
  join {_covered("stall", _RANGE_WINDOWS)} s on s.id = w.range_id
order by w.range_id
"""


def make_ranges(con: duckdb.DuckDBPyConnection) -> int:
    """The ``ranges`` table (in table order); returns the number of ranges."""
    con.execute(RANGES_SQL)
    return int(con.sql("select count(*) from ranges").fetchall()[0][0])


def range_table(con: duckdb.DuckDBPyConnection, phase_map: PhaseMap, source: str, num_ops: int) -> pa.Table:
    """The range table (``schema.RANGE_COLUMNS`` without trace / rank) in table order, GPU work attributed when
    the trace has GPU ops (``num_ops``), else null with ``gpu_reason`` (:func:`make_range_rows`, fetched)."""
    make_range_rows(con, phase_map, source, num_ops)
    return arrow(con, "select * from range_rows order by range_id")


_COLUMNS = [c for c in schema.RANGE_COLUMNS if c not in ("trace", "rank")]
# the GPU columns that need the launch calls (``busy_in_window_ns`` and ``time_ns`` do not)
_LAUNCHED_COLUMNS = (
    "thread_ops",
    "thread_busy_ns",
    "thread_span_ns",
    "window_ops",
    "window_busy_ns",
    "window_span_ns",
    "gpu_end_ns",
    "host_stall_ns",
)


def unlaunched_pids(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Processes with GPU ops none of which has its launch call in the trace (``ops``): what they launched, and
    the host stall that waits on it, are not measured. Where GPU ops belong to no process (no launch record in
    a file of several processes), every process without a launched op is one of them."""
    sql = "select pid from ops group by pid having max(launch_end_ns) = -1"
    pids = {p for (p,) in con.sql(sql).fetchall()}
    if schema.NO_ID in pids:
        launched = "select pid from ops where launch_end_ns <> -1"
        sql = f"select distinct pid from events where device < 0 and pid not in ({launched})"
        pids.update(p for (p,) in con.sql(sql).fetchall())
    return sorted(pids)


def make_range_rows(con: duckdb.DuckDBPyConnection, phase_map: PhaseMap, source: str, num_ops: int) -> int:
    """The engine table ``range_rows``: the whole range table, in table order (read it whole, a part at a time
    with :func:`range_parts`, or the rows other tables read with :func:`summary_rows`). Returns its rows."""
    _nesting(con)
    con.register("range_names", _name_values(con, phase_map))
    try:
        unlaunched, nulled = "", _LAUNCHED_COLUMNS
        if num_ops:
            _attributed(con)
            reason, joined = "", "left join range_gpu g using (range_id)"
            pids = unlaunched_pids(con)
            unlaunched = ", ".join(str(p) for p in pids)
            if schema.NO_ID in pids:  # GPU work of no process: no device busy time is a process's either
                nulled = (*_LAUNCHED_COLUMNS, "busy_in_window_ns")
        else:
            reason, joined = NO_GPU_REASON, ""
        values = {
            "source": f"{_literal(source)}::varchar",
            "range_id": "r.range_id",
            "parent_id": "n.parent_id",
            "depth": "n.depth",
            "name": "v.base",
            "domain": "r.domain",
            "phase": "v.phase",
            "pid": "r.pid",
            "tid": "r.tid",
            "start_ns": "r.start_ns",
            "end_ns": "r.end_ns",
            "wall_ns": "r.end_ns - r.start_ns",
            "attrs": "v.attrs",
            "time_ns": "g.time_ns" if num_ops else "r.end_ns - r.start_ns",
            "gpu_reason": f"{_literal(reason)}::varchar",
        }
        if unlaunched:  # what their ranges launched and the stall waiting on it: null, with the reason
            values["gpu_reason"] = (
                f"case when r.pid in ({unlaunched}) then {_literal(NO_LAUNCH_REASON)} else '' end"
            )
            values.update({c: f"case when r.pid in ({unlaunched}) then null else g.{c} end" for c in nulled})
        cols = [
            f"{values[c]} as {c}" if c in values else (f"g.{c}" if num_ops else f"null::bigint as {c}")
            for c in _COLUMNS
        ]
        con.execute(
            f"""create or replace table range_rows as select {", ".join(cols)}
            from ranges r join range_nesting n using (range_id) join range_names v on r.name = v.name {joined}
            order by r.range_id"""
        )
    finally:
        con.unregister("range_names")
    return int(con.sql("select count(*) from range_rows").fetchall()[0][0])


def range_parts(con: duckdb.DuckDBPyConnection, rows: int) -> Iterator[pa.RecordBatch]:
    """``range_rows`` in table order, ``rows`` at a time."""
    yield from batches(con.cursor(), "select * from range_rows order by range_id", rows)


def summary_rows(con: duckdb.DuckDBPyConnection, pattern: str | None) -> pa.Table:
    """The rows of ``range_rows`` the other tables read (micro-batch regions, the step table, seconds per phase),
    in table order: from them they get what they get from the whole table.

    - every range of a named phase (not ``other``), explicit micro-batch ranges (``pattern``, else
      ``mbregions.EXPLICIT_NAMES``), ``ProfilerStep#N`` and other step ranges;
    - per process, its first range and its first user range (neither an emit_nvtx op nor an NCCL range, in a
      user domain): which processes have ranges at all, and which have op ranges only (cut as a whole);
    - every ancestor of a range of a micro-batch phase (a phase range nested in another is not a region)."""
    import pyarrow as pa

    from tracing.analysis import mbregions, steps

    names = [r[0] for r in con.sql("select distinct name from range_rows").fetchall()]
    domains = [r[0] for r in con.sql("select distinct domain from range_rows").fetchall()]
    explicit, library, _ = mbregions.name_flags(names, pattern)
    step = np.fromiter(map(steps.is_step_name, names), bool, len(names))
    con.register(
        "summary_names",
        pa.table({"name": pa.array(names, pa.string()), "keep": explicit | step, "library": library}),
    )
    user = np.array([mbregions.is_user_domain(d) for d in domains], bool)
    con.register("summary_domains", pa.table({"domain": pa.array(domains, pa.string()), "user": user}))
    phases = ", ".join(f"'{p}'" for p in mbregions.MICROBATCH_PHASES)
    try:
        return arrow(
            con,
            f"""with recursive f as (
              select r.range_id, r.parent_id, r.pid, r.phase, n.keep, not n.library and d.user as is_user
              from range_rows r join summary_names n using (name) join summary_domains d using (domain)),
            kept as (
              select range_id from f where keep or phase <> 'other'
              union select min(range_id) from f group by pid
              union select min(range_id) from f where is_user group by pid),
            up as (
              select parent_id as range_id from f where phase in ({phases}) and parent_id >= 0
              union
              select r.parent_id from up join range_rows r using (range_id) where r.parent_id >= 0)
            select * from range_rows where range_id in (select range_id from kept union select range_id from up)
            order by range_id""",
        )
    finally:
        con.unregister("summary_names")
        con.unregister("summary_domains")


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _attributed(con: duckdb.DuckDBPyConnection) -> None:
    """The engine table ``range_gpu``: the GPU columns of every range (by range_id)."""
    con.execute(f"create or replace temp table thread_ops as {_attribution_sql(True)}")
    con.execute(f"create or replace temp table window_ops as {_attribution_sql(False)}")
    con.execute(
        """create or replace temp table range_window as
        select r.range_id, r.pid, r.start_ns,
          case when w.n > 0 then greatest(r.end_ns, w.last) else r.end_ns end as window_end_ns
        from ranges r left join window_ops w using (range_id)"""
    )
    for name, source in _COVER_SOURCES.items():
        con.execute(_COVER_SQL.format(name=name, source=source))
    con.execute(f"create or replace temp table range_gpu as {TABLE_SQL}")


def _nesting(con: duckdb.DuckDBPyConnection) -> None:
    """The engine table ``range_nesting`` (range_id, parent_id, depth), made a batch of ranges at a time in table
    order (the stack walk holds each thread's open ranges, never the table)."""
    import pyarrow as pa

    con.execute(
        "create or replace temp table range_nesting (range_id bigint, parent_id bigint, depth bigint)"
    )
    nesting = Nesting()
    first = 0
    sql = "select pid, tid, start_ns, end_ns from ranges order by range_id"
    for b in batches(con.cursor(), sql, NEST_ROWS):
        parent, depth = nesting.add(*(b.column(i).to_numpy() for i in range(4)))
        n = len(parent)
        con.register(
            "nest_batch",
            pa.table(
                {
                    "range_id": np.arange(first, first + n, dtype=np.int64),
                    "parent_id": parent,
                    "depth": depth.astype(np.int64),
                }
            ),
        )
        con.execute("insert into range_nesting select * from nest_batch")
        con.unregister("nest_batch")
        first += n


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


QUEUED_SQL = """
with l as (select pid, launch_start_ns as t, max(end_ns) over (partition by pid order by launch_start_ns, row
    rows unbounded preceding) as upto from ops where launch_start_ns <> -1),
  u as (select pid, start_ns as t, max(end_ns) over (partition by pid order by start_ns, row
    rows unbounded preceding) as upto from ops where launch_start_ns = -1),
  n as (select pid, launch_start_ns as t, start_ns as s from ops where launch_start_ns <> -1),
  f as (select q.*, coalesce(n.s, q.start_ns) as first_op from step_q q
    asof left join n on q.pid = n.pid and n.t >= q.start_ns)
select f.i, greatest(coalesce(l.upto, -1), coalesce(u.upto, -1)) as queued
from f asof left join l on f.pid = l.pid and l.t < f.start_ns
  asof left join u on f.pid = u.pid and u.t < f.first_op order by f.i
"""


def queued_ends(con: duckdb.DuckDBPyConnection, rows: pa.Table) -> np.ndarray:
    """Per row (``pid``, ``start_ns``) of ``rows``: the end of the GPU work its process launched before
    ``start_ns`` (GPU ops without a launch record in the file, queued before the capture, count where they
    start before the row's first op); -1 where none. The step table reads it (``steps.trace_step_phases``)."""
    import pyarrow as pa

    n = rows.num_rows
    con.register("step_q", rows.select(["pid", "start_ns"]).append_column("i", pa.array(np.arange(n))))
    try:
        got = arrow(con, QUEUED_SQL)
    finally:
        con.unregister("step_q")
    queued = np.full(n, -1, np.int64)
    queued[got.column("i").to_numpy()] = got.column("queued").to_numpy()
    return queued
