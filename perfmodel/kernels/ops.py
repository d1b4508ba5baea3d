"""The GPU ops of an ``mxperf ingest`` folder, each with its class, launch, phase, micro-batch and GEMM shapes.

Read from the ingest's own tables, in DuckDB (no pandas; the engine's memory limit and spilling apply, so a
large trace's events are never all in Python memory):

- ``events/*.parquet``: every kernel / memcpy / memset, its launch (the runtime or driver call with the same
  correlation id: ``launch_ns`` is when the host asked for it) and, for GEMMs, the input shapes of the
  launching op (``aten::linear`` / ``mm`` / ``addmm`` / ``matmul`` / ``bmm`` ..., by Kineto's external id);
- ``kernels.parquet``: the class of each kernel name (``tracing.analysis.kernel_classes``: the ingest's own
  rules, so a kernel is classed the same here as there);
- ``microbatches.parquet``: an op belongs to the micro-batch of its process whose window holds its launch
  (the latest-starting one when windows overlap: the host runs micro-batches one after the other);
- ``ranges.parquet``: an op outside every micro-batch takes the phase of the outermost phase range (not
  ``other``) holding its launch.

:func:`open_ops` gives a DuckDB connection with a table ``ops`` (:data:`OP_COLUMNS`) and ``mb`` (the micro-batch
rows, ``mb_id`` = row index, ``wall_ns`` / ``busy_ns`` / ``stall_ns`` integers); the summaries live in
``perfmodel.kernels.summary`` and ``perfmodel.kernels.diff``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.manifest import read_manifest

# op name -> (how to read M, N, K and the batch from its input shapes); see perfmodel.kernels.roofline.gemm_dims
GEMM_OPS: tuple[str, ...] = (
    "aten::linear",
    "aten::mm",
    "aten::addmm",
    "aten::matmul",
    "aten::bmm",
    "aten::baddbmm",
    "aten::_scaled_mm",
)

OP_COLUMNS = (
    "rank",
    "pid",
    "device",
    "stream",
    "kind",
    "name",
    "kernel_class",
    "start_ns",
    "dur_ns",
    "launch_ns",
    "mb_id",
    "phase",
    "step",
    "gemm_op",
    "shapes",
)

TIME_CLASSES = ("gemm", "quantize")  # the classes the diff names; every other class is "other kernels"


def check_ingest(out: Path) -> dict[str, Any]:
    """The manifest of a complete ``mxperf ingest`` folder, or one clear :class:`InputError`."""
    out = Path(out)
    if out.is_file():
        raise InputError(
            f"{out}: a file; this command reads the folder `mxperf ingest` writes: mxperf ingest {out} -o DIR"
        )
    manifest = read_manifest(out)
    kind = manifest["kind"]
    if kind == "run":
        raise InputError(
            f"{out}: a run folder; ingest its traces first (mxperf ingest {out} -o DIR) and pass DIR"
        )
    if kind != "ingest":
        raise InputError(f"{out}: a '{kind}' folder; this command reads `mxperf ingest` output")
    if manifest["status"] != "complete":
        raise InputError(
            f"{out}: ingest status is '{manifest['status']}', not complete; re-run mxperf ingest"
        )
    if not (out / store.KERNELS).is_file():
        raise InputError(f"{out}: no {store.KERNELS}; re-run mxperf ingest with this version")
    events = sorted((out / store.EVENTS_DIR).glob("*.parquet"))
    if not events:
        raise InputError(
            f"{out / store.EVENTS_DIR}: no event tables (a metric log has no GPU ops); pass a trace's ingest"
        )
    return manifest


def _lit(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


@contextlib.contextmanager
def open_ops(out: str | Path) -> Iterator[Any]:
    """A DuckDB connection (mxperf's engine limits) holding ``ops`` and ``mb`` for the ingest folder ``out``."""
    from tracing.ingest import engine

    out = Path(out)
    check_ingest(out)
    with engine.session() as con:
        try:
            _build(con, out)
        except InputError:
            raise
        except Exception as exc:  # a table of the wrong shape: name the folder, never a traceback
            import duckdb

            if isinstance(exc, duckdb.Error) and not isinstance(exc, duckdb.OutOfMemoryException):
                first = str(exc).splitlines()[0]
                raise InputError(f"{out}: its tables cannot be read together ({first})") from None
            raise
        yield con


def _build(con: Any, out: Path) -> None:
    events = _lit(out / store.EVENTS_DIR / "*.parquet")
    # rank from the file name (events/rank-<r>.parquet); another name (nsys: rank-<file>) has no rank
    con.execute(
        f"""
        create temp view ev as
        select kind::varchar as kind, name::varchar as name, pid, tid, device, stream, start_ns, dur_ns,
               correlation, external_id, shapes::varchar as shapes, filename as src,
               try_cast(regexp_extract(filename, 'rank-(-?[0-9]+)\\.parquet$', 1) as bigint) as rank
        from read_parquet({events}, filename = true)
        """
    )
    classes = _lit(out / store.KERNELS)
    con.execute(
        f"""
        create temp table cls as
        select rank, device, kind, name, any_value(kernel_class) as kernel_class
        from read_parquet({classes}) group by all
        """
    )
    gemm_names = ", ".join(f"'{n}'" for n in GEMM_OPS)
    con.execute(
        f"""
        create temp table raw_ops as
        with launches as (
            select src, pid, correlation, min(start_ns) as launch_ns, max(external_id) as ext
            from ev where kind in ('runtime', 'driver') and correlation >= 0 group by all
        ),
        g as (select * from ev where kind in ('kernel', 'memcpy', 'memset')),
        joined as (
            select g.*, l.launch_ns, l.ext, l.pid as launch_pid
            from g left join launches l
              on l.src = g.src and l.correlation = g.correlation and g.correlation >= 0
                 and (g.pid < 0 or l.pid = g.pid)
            qualify row_number() over (partition by g.src, g.kind, g.device, g.stream, g.start_ns, g.correlation
                                       order by l.pid) = 1
        ),
        gemm_ops as (
            select src, pid, external_id, arg_max(name, start_ns) as gemm_op, arg_max(shapes, start_ns) as shapes
            from ev where kind = 'cpu_op' and external_id >= 0 and shapes <> ''
              and regexp_replace(name, ',.*$', '') in ({gemm_names})
            group by all
        )
        select j.src, j.rank, coalesce(j.launch_pid, j.pid) as pid, j.device, j.stream, j.kind, j.name,
               j.start_ns, j.dur_ns, j.launch_ns,
               coalesce(c.kernel_class, case when j.kind in ('memcpy', 'memset') then j.kind else 'other' end)
                   as kernel_class,
               s.gemm_op, s.shapes
        from joined j
        left join cls c on c.rank is not distinct from j.rank and c.device = j.device and c.kind = j.kind
                          and c.name = j.name
        left join gemm_ops s on s.src = j.src and s.pid = coalesce(j.launch_pid, j.pid)
                             and s.external_id = case when j.external_id >= 0 then j.external_id else j.ext end
        """
    )
    _micro_batches(con, out)
    _phases(con, out)
    con.execute(
        """
        create temp table ops as
        with a as (
            select o.*, m.mb_id as m_id, m.end_ns as m_end, m.phase as m_phase, m.step as m_step
            from raw_ops o asof left join mb_keys m
              on coalesce(o.rank, -1) = m.rank_key and o.pid = m.pid
                 and coalesce(o.launch_ns, o.start_ns) >= m.start_ns
        )
        select a.rank, a.pid, a.device, a.stream, a.kind, a.name, a.kernel_class, a.start_ns, a.dur_ns,
               a.launch_ns,
               case when coalesce(a.launch_ns, a.start_ns) < a.m_end then a.m_id end as mb_id,
               case when coalesce(a.launch_ns, a.start_ns) < a.m_end then a.m_phase else p.phase end as phase,
               case when coalesce(a.launch_ns, a.start_ns) < a.m_end then a.m_step end as step,
               a.gemm_op, a.shapes
        from a left join op_phase p
          on p.src = a.src and p.device = a.device and p.stream = a.stream and p.start_ns = a.start_ns
             and p.kind = a.kind
        """
    )


def _micro_batches(con: Any, out: Path) -> None:
    path = out / store.MICROBATCHES
    if path.is_file():
        con.execute(
            f"""
            create temp table mb as
            select (row_number() over () - 1)::bigint as mb_id, *,
                   (end_ns - start_ns)::bigint as wall_ns,
                   round(gpu_busy_seconds * 1e9)::bigint as busy_ns,
                   round(host_stall_seconds * 1e9)::bigint as stall_ns
            from read_parquet({_lit(path)})
            """
        )
        cols = {r[0] for r in con.execute("describe mb").fetchall()}
        missing = {"pid", "start_ns", "end_ns", "phase", "step", "tokens_per_microbatch"} - cols
        if missing:
            raise InputError(f"{path}: no column(s) {', '.join(sorted(missing))}; re-run mxperf ingest")
    else:
        con.execute(
            """
            create temp table mb (mb_id bigint, rank bigint, pid bigint, start_ns bigint, end_ns bigint,
                phase varchar, step bigint, microbatch bigint, tokens_per_microbatch bigint, num_tokens bigint,
                precision varchar, model varchar, wall_ns bigint, busy_ns bigint, stall_ns bigint)
            """
        )
    con.execute(
        """
        create temp table mb_keys as
        select mb_id, coalesce(rank, -1) as rank_key, pid, start_ns, end_ns, phase, step from mb
        where start_ns is not null and end_ns is not null and pid is not null
        """
    )


def _phases(con: Any, out: Path) -> None:
    """``op_phase``: the phase of every op outside micro-batches, from the outermost phase range holding its
    launch (ranges of phase ``other`` are not phases)."""
    path = out / store.RANGES
    if not path.is_file():
        con.execute(
            "create temp table op_phase as select src, device, stream, start_ns, kind, null::varchar as phase "
            "from raw_ops where false"
        )
        return
    con.execute(
        f"""
        create temp table op_phase as
        with r as (
            select coalesce(rank, -1) as rank_key, pid, start_ns, end_ns, depth, phase
            from read_parquet({_lit(path)})
            where phase is not null and phase <> 'other' and end_ns > start_ns
        )
        select o.src, o.device, o.stream, o.start_ns, o.kind, arg_min(r.phase, r.depth) as phase
        from raw_ops o join r
          on r.rank_key = coalesce(o.rank, -1) and r.pid = o.pid
             and coalesce(o.launch_ns, o.start_ns) >= r.start_ns and coalesce(o.launch_ns, o.start_ns) < r.end_ns
        group by all
        """
    )


def busy_ns(out: str | Path) -> int:
    """GPU busy time of the ingest (the union per device, summed over devices: ``devices.parquet``)."""
    import pyarrow.compute as pc

    t = store.read_arrow(Path(out) / store.DEVICES, ["busy_ns"])
    total = pc.sum(t.column("busy_ns")).as_py()
    return int(total or 0)


def placement_note(con: Any) -> str | None:
    """Where GPU ops without a launch call (1 % of the ops or more; a few are common) go: into the micro-batch
    whose window holds their start on the GPU, not their launch -- said by ``mxperf kernels`` and ``diff``."""
    n, total, mbs = con.execute(
        "select count(*) filter (where launch_ns is null), count(*), (select count(*) from mb) from ops"
    ).fetchone()
    if not mbs or not n or n < 0.01 * total:
        return None
    return (
        f"{n} of {total} GPU ops have no launch call: each is put in the micro-batch whose window holds its "
        "start on the GPU, not its launch; where the GPU runs behind the host, its time can land in a later "
        "micro-batch"
    )
