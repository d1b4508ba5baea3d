"""``mxperf kernels``: the top kernels and kernel classes of an ingest -- time, count, share of GPU busy, per
phase and per micro-batch on average -- with the GEMM shapes where the trace recorded them.

Every figure is a query over ``perfmodel.kernels.ops``' ``ops`` table (no pandas). Share of busy is a kernel's
summed duration over the ingest's GPU busy time (the union per device, ``devices.parquet``): kernels that run
concurrently on several streams can add up to more than 100 %.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfmodel.kernels.ops import busy_ns, check_ingest, open_ops, placement_note


def summarize(out: str | Path, *, top: int = 20, shapes_per_kernel: int = 3) -> dict[str, Any]:
    """The document ``mxperf kernels --json`` prints: ``busy_ns``, ``microbatches`` (phase -> count),
    ``classes`` and ``kernels`` (top ``top`` by total time; 0 = all), each row with ``per_phase_ns`` (phase ->
    summed ns) and ``per_microbatch_ns`` (phase -> mean ns per micro-batch of that phase), GEMM rows with
    ``shapes`` (the launching op and its input shapes, most frequent first)."""
    check_ingest(Path(out))  # before any table is read: one clear line for a foreign folder
    busy = busy_ns(out)
    with open_ops(out) as con:
        mbs = dict(con.execute("select phase, count(*) from mb group by phase order by phase").fetchall())
        kernels = _rows(con, "name, any_value(kernel_class) as kernel_class", "name", top, busy, mbs)
        classes = _rows(con, "kernel_class", "kernel_class", 0, busy, mbs)
        if kernels:
            names = [r["name"] for r in kernels]
            con.execute("create temp table top_names as select unnest(?::varchar[]) as name", [names])
            shaped = con.execute(
                """
                select name, gemm_op, shapes, count(*) as n, sum(dur_ns)::bigint as total_ns
                from ops join top_names using (name)
                where shapes is not null and kernel_class = 'gemm'
                group by all order by name, n desc, total_ns desc, shapes
                """
            ).fetchall()
            by_name: dict[str, list[dict[str, Any]]] = {}
            for name, op, shapes, n, total in shaped:
                rows = by_name.setdefault(name, [])
                if len(rows) < shapes_per_kernel:
                    rows.append({"op": op, "shapes": shapes, "count": int(n), "total_ns": int(total)})
            for r in kernels:
                r["shapes"] = by_name.get(r["name"], [])
        total_ops = con.execute("select count(*), coalesce(sum(dur_ns), 0)::bigint from ops").fetchone()
        note = placement_note(con)
    return {
        "busy_ns": busy,
        "ops": int(total_ops[0]),
        "op_ns": int(total_ops[1]),
        "microbatches": {str(k): int(v) for k, v in mbs.items()},
        "classes": classes,
        "kernels": kernels,
        "notes": [note] if note else [],  # what the per-micro-batch figures rest on
    }


def _rows(con: Any, select: str, key: str, top: int, busy: int, mbs: dict[str, int]) -> list[dict[str, Any]]:
    limit = f"limit {int(top)}" if top else ""
    rows = con.execute(
        f"""
        select {select}, count(*) as count, sum(dur_ns)::bigint as total_ns, max(dur_ns) as max_ns
        from ops group by {key} order by total_ns desc, {key} {limit}
        """
    ).fetchall()
    cols = [d[0] for d in con.description]
    out = [dict(zip(cols, r, strict=True)) for r in rows]
    keys = [r[key] for r in out]
    per_phase = con.execute(
        f"""
        select {key} as k, coalesce(phase, '') as phase, sum(dur_ns)::bigint as total_ns,
               sum(case when mb_id is not null then dur_ns else 0 end)::bigint as mb_ns
        from ops where {key} in (select unnest(?::varchar[])) group by all order by k, phase
        """,
        [keys],
    ).fetchall()
    phases: dict[str, dict[str, int]] = {}
    in_mb: dict[str, dict[str, float]] = {}
    for k, phase, total, mb_ns in per_phase:
        if phase:
            phases.setdefault(k, {})[phase] = int(total)
            if mbs.get(phase):
                in_mb.setdefault(k, {})[phase] = int(mb_ns) / mbs[phase]
    for r in out:
        r["count"] = int(r["count"])
        r["total_ns"] = int(r["total_ns"])
        r["max_ns"] = int(r["max_ns"])
        r["mean_ns"] = r["total_ns"] / r["count"] if r["count"] else None
        r["share_of_busy"] = r["total_ns"] / busy if busy > 0 else None
        r["per_phase_ns"] = phases.get(r[key], {})
        r["per_microbatch_ns"] = in_mb.get(r[key], {})
    return out


def document(out: str | Path, *, top: int, dev: Any = None) -> dict[str, Any]:
    """The tables of ``mxperf kernels OUT --json`` (without ``--model-shape``'s floors): the summary, the
    roofline of the GEMMs with shapes on ``dev`` (a ``perfmodel.kernels.devices.Device``, or None: no roofline) and
    the communication per step and rank when the trace has collective kernels. ``mxperf kernels`` prints it and
    the dashboard's Kernels page shows it."""
    doc = summarize(out, top=top)
    if dev is not None:
        from perfmodel.kernels.ops import open_ops
        from perfmodel.kernels.roofline import gemm_table

        with open_ops(out) as con:
            gemms = gemm_table(con, dev, top=top)
        notes = sorted({g["peak_note"] for g in gemms if g.get("peak_note")})
        if not gemms:
            notes.append("no GEMM kernel of this trace has recorded shapes (record_shapes=True)")
        doc["roofline"] = {
            "device": {"id": dev.id, "name": dev.name, "hbm_bytes_per_s": dev.hbm_bytes_per_s},
            "gemms": gemms,
            "notes": notes,
        }
    if any(c["kernel_class"] == "communication" for c in doc["classes"]):
        from perfmodel.kernels.comm import communication
        from perfmodel.kernels.ops import open_ops

        with open_ops(out) as con:
            doc["communication"] = communication(con, out)
    return doc
