"""The kernel summary of ``mxperf kernels`` as one flat Arrow table (``--parquet``; ``mxperf.open(p)``'s
``kernel_summary()``): a row per kernel class and per top kernel, the numbers of the ``--json`` document.

Columns (docs/contracts.md, "mxperf kernels --parquet"): :data:`FIXED_COLUMNS`, then per phase P of the
ingest (sorted) ``per_phase_ns.P`` (summed ns of the row's ops in P; 0 when none) and
``per_microbatch_ns.P`` (mean ns per micro-batch of P; 0.0 when the row has no op in P's micro-batches,
null when P has no micro-batches): the JSON's nested ``per_phase_ns`` / ``per_microbatch_ns`` keys flattened
with a dot. The ingest-wide figures (``busy_ns``, ``ops``, ``op_ns``, micro-batches per phase) are in the file
metadata (``tracing.outputs.store.table_meta``). No pandas: the command builds Arrow only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

# column -> Arrow type name; one row per class (level "class") and per kernel (level "kernel")
FIXED_COLUMNS: dict[str, str] = {
    "level": "string",  # "class" | "kernel"
    "position": "int64",  # order within its level by total time, 0 = largest (the --json list order)
    "name": "string",  # the kernel name; null on class rows
    "kernel_class": "string",
    "count": "int64",
    "total_ns": "int64",
    "max_ns": "int64",
    "mean_ns": "float64",
    "share_of_busy": "float64",  # total_ns / GPU busy (the busy union of devices.parquet); null when busy 0
    "top_shape_op": "string",  # GEMM rows: the launching op of the most frequent recorded input shapes
    "top_shapes": "string",
    "top_shape_count": "int64",
}
META_KEYS = ("busy_ns", "ops", "op_ns", "microbatches")


def phases(doc: dict[str, Any]) -> list[str]:
    """The phases of a kernels document: every phase a row has time in, and every phase with micro-batches."""
    seen = set(doc["microbatches"])
    for r in (*doc["classes"], *doc["kernels"]):
        seen.update(r["per_phase_ns"])
    return sorted(seen)


def summary_table(doc: dict[str, Any]) -> pa.Table:
    """The flat table of a ``perfmodel.kernels.summary.summarize`` / ``document`` result."""
    import pyarrow as pa

    ps = phases(doc)
    cols: dict[str, list[Any]] = {c: [] for c in FIXED_COLUMNS}
    for p in ps:
        cols[f"per_phase_ns.{p}"] = []
        cols[f"per_microbatch_ns.{p}"] = []
    for level, rows in (("class", doc["classes"]), ("kernel", doc["kernels"])):
        for i, r in enumerate(rows):
            shape = (r.get("shapes") or [None])[0]
            values = {
                "level": level,
                "position": i,
                "name": r.get("name"),
                "kernel_class": r["kernel_class"],
                "count": r["count"],
                "total_ns": r["total_ns"],
                "max_ns": r["max_ns"],
                "mean_ns": r["mean_ns"],
                "share_of_busy": r["share_of_busy"],
                "top_shape_op": shape["op"] if shape else None,
                "top_shapes": shape["shapes"] if shape else None,
                "top_shape_count": shape["count"] if shape else None,
            }
            for c, v in values.items():
                cols[c].append(v)
            for p in ps:
                cols[f"per_phase_ns.{p}"].append(int(r["per_phase_ns"].get(p, 0)))
                mb = r["per_microbatch_ns"].get(p)
                if mb is None and doc["microbatches"].get(p):
                    mb = 0.0
                cols[f"per_microbatch_ns.{p}"].append(mb)
    types = {c: FIXED_COLUMNS.get(c) or ("int64" if c.startswith("per_phase") else "float64") for c in cols}
    return pa.table({c: pa.array(v, type=pa.type_for_alias(types[c])) for c, v in cols.items()})


def write_summary(doc: dict[str, Any], path: str | Path, *, source: str | Path) -> Path:
    """Write :func:`summary_table` to ``path`` (atomically), the ingest-wide figures and ``source`` (the
    ingest folder) in its metadata."""
    from tracing.outputs import store

    meta = {k: doc[k] for k in META_KEYS}
    return store.write_table(summary_table(doc), path, {"source": str(source), **meta})
