"""Communication per step and rank: time in collective kernels (class ``communication``: NCCL / RCCL) and how
much of it overlaps compute kernels on other streams, over ``perfmodel.kernels.ops``' ``ops`` table (DuckDB).

A kernel's step is its micro-batch's, or for a kernel launched outside every micro-batch window (a gradient
reduce-scatter after the backward, an optimizer's all-reduce) the step of the latest micro-batch of its process
started before its launch; kernels launched before any micro-batch (or in an ingest without micro-batches) form
step -1 ("-": no step; their time is ``unassigned_ns``). Per (rank, device, step):

- ``comm_ns``: summed durations of its communication kernels; ``comm_union_ns``: their busy union;
- ``overlapped_ns``: the part of that union during which a compute kernel (any class but communication,
  memcpy, memset) runs -- necessarily on another stream, a stream runs one kernel at a time;
- ``exposed_ns`` = union - overlapped: communication nothing else hides.

Per step, the slowest rank (largest summed phase time in ``steps.parquet``, else the latest-ending kernel) and
its exposed share of that time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_ISLANDS = """
create temp table comm_islands as
with k as (
    select coalesce(o.rank, -1) as rank, o.device, coalesce(m.step, -1) as step,
           case when o.kernel_class = 'communication' then 'comm' else 'compute' end as kind,
           o.start_ns as s, o.start_ns + o.dur_ns as e, o.dur_ns
    from ops o asof left join mb_keys m
      on coalesce(o.rank, -1) = m.rank_key and o.pid = m.pid and coalesce(o.launch_ns, o.start_ns) >= m.start_ns
    where o.kind = 'kernel' and o.kernel_class not in ('memcpy', 'memset') and o.dur_ns > 0
),
x as (
    select *, max(e) over (partition by rank, device, step, kind order by s, e
                           rows between unbounded preceding and 1 preceding) as prev_e
    from k
),
y as (
    select *, sum(case when prev_e is null or s > prev_e then 1 else 0 end)
              over (partition by rank, device, step, kind order by s, e rows unbounded preceding) as isl
    from x
)
select rank, device, step, kind, isl, min(s) as s, max(e) as e, sum(dur_ns)::bigint as dur_ns, count(*) as n
from y group by all
"""

_PER_STEP = """
with c as (
    select rank, device, step, sum(dur_ns)::bigint as comm_ns, sum(e - s)::bigint as comm_union_ns,
           sum(n)::bigint as kernels, max(e) as last_end
    from comm_islands where kind = 'comm' group by all
),
ov as (
    select c.rank, c.device, c.step, sum(least(c.e, k.e) - greatest(c.s, k.s))::bigint as overlapped_ns
    from comm_islands c join comm_islands k
      on c.rank = k.rank and c.device = k.device and c.step = k.step and c.kind = 'comm' and k.kind = 'compute'
         and k.s < c.e and k.e > c.s
    group by all
)
select c.rank, c.device, c.step, c.kernels, c.comm_ns, c.comm_union_ns, coalesce(ov.overlapped_ns, 0) as overlapped_ns
from c left join ov using (rank, device, step)
order by c.step, c.rank, c.device
"""


def communication(con: Any, out: str | Path) -> dict[str, Any]:
    """``{"per_rank_step": [...], "per_step": [...], "unassigned_ns": int, "comm_ns": int}`` (see module doc)."""
    con.execute("drop table if exists comm_islands")
    con.execute(_ISLANDS)
    cur = con.execute(_PER_STEP)
    cols = [d[0] for d in cur.description]
    rows = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    total, unassigned = con.execute(
        """
        select coalesce(sum(dur_ns), 0)::bigint,
               coalesce(sum(dur_ns) filter (where not exists (
                   select 1 from mb_keys m where m.rank_key = coalesce(o.rank, -1) and m.pid = o.pid
                     and m.start_ns <= coalesce(o.launch_ns, o.start_ns))), 0)::bigint
        from ops o where kernel_class = 'communication' and kind = 'kernel'
        """
    ).fetchone()
    step_ns: dict[tuple[int, int], int] = {}
    path = Path(out) / "steps.parquet"
    if path.is_file():
        for rank, step, ns in con.execute(
            "select coalesce(rank, -1), step, sum(round(seconds * 1e9))::bigint from read_parquet(?) "
            "where pid >= 0 and seconds = seconds group by all",
            [str(path)],
        ).fetchall():
            step_ns[(int(rank), int(step))] = int(ns)
    for r in rows:
        for k in ("rank", "device", "step", "kernels", "comm_ns", "comm_union_ns", "overlapped_ns"):
            r[k] = int(r[k])
        r["exposed_ns"] = r["comm_union_ns"] - r["overlapped_ns"]
        r["overlap_share"] = r["overlapped_ns"] / r["comm_union_ns"] if r["comm_union_ns"] else None
        r["step_ns"] = step_ns.get((r["rank"], r["step"]))
        r["exposed_share_of_step"] = r["exposed_ns"] / r["step_ns"] if r["step_ns"] else None
    per_step = []
    for st in sorted({r["step"] for r in rows}):
        rs = [r for r in rows if r["step"] == st]
        slow = max(rs, key=lambda r: (r["step_ns"] or 0, r["comm_union_ns"]))
        per_step.append(
            {
                "step": st,
                "ranks": len({r["rank"] for r in rs}),
                "comm_ns": sum(r["comm_ns"] for r in rs),
                "exposed_ns": sum(r["exposed_ns"] for r in rs),
                "slowest_rank": slow["rank"],
                "slowest_step_ns": slow["step_ns"],
                "slowest_exposed_share": slow["exposed_share_of_step"],
            }
        )
    return {
        "per_rank_step": rows,
        "per_step": per_step,
        "comm_ns": int(total),
        "unassigned_ns": int(unassigned),
    }


def render(doc: dict[str, Any]) -> list[str]:
    """Lines for ``mxperf kernels``."""
    lines = [
        "",
        f"communication kernels {doc['comm_ns'] / 1e6:.3f} ms in all"
        + (
            f" ({doc['unassigned_ns'] / 1e6:.3f} ms before any micro-batch: no step)"
            if doc["unassigned_ns"]
            else ""
        ),
        f"{'step':>5} {'rank':>5} {'dev':>4} {'kernels':>8} {'comm ms':>9} {'union ms':>9} {'overlap ms':>10} "
        f"{'exposed ms':>10} {'overlap %':>9} {'step ms':>9} {'exposed %':>9}",
    ]
    for r in doc["per_rank_step"]:
        ov = "-" if r["overlap_share"] is None else f"{100 * r['overlap_share']:.1f}"
        ex = "-" if r["exposed_share_of_step"] is None else f"{100 * r['exposed_share_of_step']:.2f}"
        step = "-" if r["step_ns"] is None else f"{r['step_ns'] / 1e6:.3f}"
        lines.append(
            f"{'-' if r['step'] < 0 else r['step']:>5} {r['rank']:>5} {r['device']:>4} {r['kernels']:>8} {r['comm_ns'] / 1e6:>9.3f} "
            f"{r['comm_union_ns'] / 1e6:>9.3f} {r['overlapped_ns'] / 1e6:>10.3f} {r['exposed_ns'] / 1e6:>10.3f} "
            f"{ov:>9} {step:>9} {ex:>9}"
        )
    for s in doc["per_step"]:
        if s["ranks"] > 1 and s["step"] >= 0 and s["slowest_exposed_share"] is not None:
            lines.append(
                f"step {s['step']}: slowest rank {s['slowest_rank']} ({s['slowest_step_ns'] / 1e6:.3f} ms), "
                f"exposed communication {100 * s['slowest_exposed_share']:.2f} % of it"
            )
    return lines
