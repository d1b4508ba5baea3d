"""Every table the tracing side produces: column names, dtypes and units, written once.

Times are int64 nanoseconds from ingest on. Kineto times are absolute epoch ns (``baseTimeNanoseconds +
ts*1000``); Nsight Systems times are ns since the session start (its ``utcEpochNs`` is in the trace meta);
mxperf range logs use the writing process's monotonic clock. Times are only compared within one trace.

Tables (one module, so producers and readers cannot drift apart):

- ``EVENT_COLUMNS``: the normalized event table, one row per event, ``events/rank-<r>.parquet``.
  ``kind`` is one of ``EVENT_KINDS``; GPU rows have ``device``/``stream`` >= 0, CPU rows have -1 there.
  ``correlation`` joins a GPU op to its launching runtime/driver call (CUPTI correlation id; -1 = none).
- ``DEVICE_COLUMNS``: one row per (trace, process, device): span, busy, idle, host stall ... (``metrics.py``).
- ``STREAM_COLUMNS``: HTA-style idle classification per (device, stream), for comparison.
- ``RANGE_COLUMNS``: one row per range (user annotation, NVTX, range log) with attributed GPU work.
- ``KERNEL_COLUMNS``: one row per (trace, device, kernel name): count, total time, class.
- ``STEP_COLUMNS``: seconds per (trace, rank, process, step, phase) from a trace's step and phase ranges.
- ``MISMATCH_COLUMNS``: sampler/learner mismatch metrics per step, as a verl / NeMo RL metric log has them.
- ``STEP_TOKEN_COLUMNS``: each step's generation batch (prompt / generated tokens, sequences) from such a log.
- ``MICROBATCH_COLUMNS``: the shared micro-batch contract read by ``perfmodel`` (sweeps and ingests, v2).
- ``RANGE_LOG_COLUMNS``: mxperf's own range log (``tracing.capture.ranges``), as a run writes it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tracing.outputs.errors import InputError

if TYPE_CHECKING:  # the command works on Arrow tables and never imports pandas; notebooks get frames
    import pandas as pd
    import pyarrow as pa

# Canonical phases of an RL step (the ``phase`` column of ranges, steps and micro-batches).
PHASES: tuple[str, ...] = ("generate", "logprob", "update", "sync", "reward", "other")

# Event kinds (the ``kind`` column). GPU ops that count as "busy" are GPU_OP_KINDS.
KERNEL, MEMCPY, MEMSET, SYNC = "kernel", "memcpy", "memset", "sync"
RUNTIME, DRIVER = "runtime", "driver"
CPU_OP, RANGE, GPU_RANGE, PYTHON = "cpu_op", "range", "gpu_range", "python"
EVENT_KINDS: tuple[str, ...] = (
    KERNEL,
    MEMCPY,
    MEMSET,
    SYNC,
    RUNTIME,
    DRIVER,
    CPU_OP,
    RANGE,
    GPU_RANGE,
    PYTHON,
)
GPU_OP_KINDS: tuple[str, ...] = (KERNEL, MEMCPY, MEMSET)
LAUNCH_KINDS: tuple[str, ...] = (RUNTIME, DRIVER)

NO_ID = -1  # integer columns use -1 for "absent" (no correlation, CPU row has no device, ...)

EVENT_COLUMNS: dict[str, str] = {
    "kind": "category",  # EVENT_KINDS
    "name": "category",  # kernel / API / op / range name
    "domain": "category",  # NVTX domain ("" for Kineto)
    "pid": "int64",  # OS process id (GPU ops: the launching process when known, else -1)
    "tid": "int64",  # OS thread id (GPU ops: -1)
    "device": "int64",  # GPU index; -1 on CPU rows
    "stream": "int64",  # CUDA stream; -1 on CPU rows
    "start_ns": "int64",
    "dur_ns": "int64",
    "correlation": "int64",  # CUPTI correlation id; -1 = none
    "external_id": "int64",  # Kineto "External id" (links a kernel to its ATen op); -1 = none
    "bytes": "int64",  # memcpy / memset size; -1 = n/a
    "end_tid": "int64",  # NVTX start/end ranges that end on another thread; -1 = same thread / n/a
    # Input shapes of an op as compact JSON ("[[4,512],[32000,4096]]"): Kineto ``args["Input Dims"]``
    # (record_shapes=True), nsys ``emit_nvtx(record_shapes=True)``'s ``sizes = [...]``; "" when absent.
    "shapes": "category",
}

DEVICE_COLUMNS: dict[str, str] = {
    "trace": "string",  # the input path
    "format": "string",  # kineto | nsys | rangelog
    "rank": "Int64",  # null when unknown
    "pid": "Int64",
    "device": "int64",
    "first_ns": "int64",  # first GPU op start
    "last_ns": "int64",  # last GPU op end
    "span_ns": "int64",  # last_ns - first_ns
    "busy_ns": "int64",  # |union of kernel, memcpy, memset over all streams|
    "idle_ns": "int64",  # span - busy
    "host_stall_ns": "int64",  # launch-end rule (docs/contracts.md)
    "host_stall_ambiguous_ns": "int64",  # part of host stall whose launch call began before the gap
    "unattributed_ns": "int64",  # gaps whose next op has no launch record (counted in other_idle_ns)
    "other_idle_ns": "int64",  # idle - host_stall
    "host_stall_fraction": "float64",  # host_stall / span; null when much idle is unattributed
    "num_kernels": "int64",
    "num_memcpy": "int64",
    "num_memset": "int64",
    "num_streams": "int64",
    "same_stream_overlap_ns": "int64",  # overlap of consecutive ops on one stream (PDL), counted once
    # The device seen by every process of the trace set (colocated sampler + learner, MPS), inside this
    # process's [first_ns, last_ns]; equal to the per-process columns when it is alone on the device.
    "device_processes": "int64",  # processes of the trace set with GPU ops on this device
    "device_busy_ns": "int64",  # |union of every process's busy intervals on this device|
    "device_idle_ns": "int64",  # span - device_busy: idle for the device, not only for this process
    "device_host_stall_ns": "int64",  # this process's host stall while no process kept the device busy
}

STREAM_COLUMNS: dict[str, str] = {
    "trace": "string",
    "rank": "Int64",
    "pid": "Int64",
    "device": "int64",
    "stream": "int64",
    "num_ops": "int64",
    "span_ns": "int64",
    "busy_ns": "int64",  # sum of op durations (same-stream overlaps counted once)
    "idle_ns": "int64",  # sum of gaps between consecutive ops (negative gaps clamped to 0)
    "host_wait_ns": "int64",  # HTA rule: launch call started (or ended, rule="end") after the previous op ended
    "kernel_wait_ns": "int64",  # gap < kernel_wait_threshold_ns
    "other_wait_ns": "int64",
    "host_wait_share": "float64",  # host_wait / idle
    "negative_gaps": "int64",  # consecutive ops that overlap on the same stream
}

RANGE_COLUMNS: dict[str, str] = {
    "trace": "string",
    "rank": "Int64",
    "source": "string",  # user_annotation | nvtx | rangelog
    "range_id": "int64",
    "parent_id": "int64",  # -1 at the top
    "depth": "int64",
    "name": "string",
    "domain": "string",
    "phase": "string",  # canonical phase from phase_map.toml
    "pid": "int64",
    "tid": "int64",
    "start_ns": "int64",
    "end_ns": "int64",
    "wall_ns": "int64",  # host wall time: end - start
    "attrs": "string",  # JSON text
    # One time basis (docs/contracts.md, v2): the range's window runs from its start to the later of its end and the end
    # of the last GPU op launched inside it (any thread of the process); busy and stall are inside it.
    "gpu_end_ns": "Int64",  # end of the last GPU op launched inside the range (null: none launched)
    "time_ns": "int64",  # window length: max(end, gpu_end) - start (= wall_ns without GPU work)
    # GPU work launched inside the range on the same thread ...
    "thread_ops": "Int64",
    "thread_busy_ns": "Int64",
    "thread_span_ns": "Int64",
    # ... and inside its time window from any thread of the process.
    "window_ops": "Int64",
    "window_busy_ns": "Int64",
    "window_span_ns": "Int64",
    "busy_in_window_ns": "Int64",  # device busy union inside the window [start, start + time_ns]
    "host_stall_ns": "Int64",  # device host-stall intervals inside the window
    "gpu_reason": "string",  # why GPU columns are null ("" when they are set)
}

KERNEL_COLUMNS: dict[str, str] = {
    "trace": "string",
    "rank": "Int64",
    "device": "int64",
    "kind": "string",
    "name": "string",
    "kernel_class": "string",
    "count": "int64",
    "total_ns": "int64",
    "mean_ns": "float64",
    "max_ns": "int64",
}

STEP_COLUMNS: dict[str, str] = {
    "trace": "string",
    "rank": "Int64",
    "pid": "int64",
    "step": "int64",
    "phase": "string",  # generate | logprob | update | sync | other (step wall time outside named phases)
    "seconds": "float64",  # union of the step's ranges of this phase on this process
}
# Rows from a metric log (verl timing_s/*, NeMo RL timing/train/*): trace = the log, rank null, pid -1 (the
# timers belong to no one process), seconds = the summed timers of the phase; NaN = the log does not say.

# Across the ranks of one ingest (written when it holds more than one rank):
# stragglers.parquet, one row per step: the rank the job waited for (tracing.analysis.ranks.straggler_table).
STRAGGLER_COLUMNS: dict[str, str] = {
    "step": "int64",
    "processes": "int64",  # processes that ran the step
    "slowest": "string",  # "rank 3" (or "pid N" without a rank)
    "slowest_rank": "Int64",
    "slowest_seconds": "float64",
    "fastest": "string",
    "fastest_rank": "Int64",
    "fastest_seconds": "float64",
    "median_seconds": "float64",
    "lag_seconds": "float64",  # slowest - median
    "spread_pct": "float64",  # 100 * (slowest / fastest - 1)
    "job_seconds": "float64",  # = slowest_seconds: the step time the job waits for
}
# rank_spread.parquet, one row per device index: busy and host stall across the (rank, process) rows using it.
RANK_SPREAD_COLUMNS: dict[str, str] = {
    "device": "int64",
    "processes": "int64",
    "busy_min_ns": "int64",
    "busy_median_ns": "float64",
    "busy_max_ns": "int64",
    "busy_spread_pct": "float64",  # 100 * (max / min - 1)
    "least_busy_rank": "Int64",
    "most_busy_rank": "Int64",
    "host_stall_median_ns": "float64",
    "host_stall_max_ns": "Int64",  # host stall over the ranks where it is measured (null: none)
    "most_stalled_rank": "Int64",
}

MISMATCH_COLUMNS: dict[str, str] = {
    "trace": "string",  # the metric log
    "framework": "string",  # verl | nemo_rl
    "precision": "string",  # label of the run (--label / mxperf.toml), null when unlabelled
    "step": "int64",
    # mxperf's name where the formula is mxperf's (kl_k1, kl_k3, token_mult_prob_error, prob_abs_diff_mean,
    # prob_abs_diff_max), else the framework's own (gen_kl_error, rollout_is_mean, ...)
    "metric": "string",
    "key": "string",  # the key as logged (rollout_corr/kl, train/token_mult_prob_error)
    "value": "float64",
}

# step_tokens.parquet (ingest of a metric log that gives them), one row per (log, step) with any count:
# tracing.ingest.metric_logs.step_tokens; null = the log does not say.
STEP_TOKEN_COLUMNS: dict[str, str] = {
    "trace": "string",  # the metric log
    "framework": "string",  # verl | nemo_rl
    "step": "int64",
    "prompt_tokens": "Int64",  # over the step's sequences
    "generated_tokens": "Int64",  # response tokens over the step's sequences
    "sequences": "Int64",  # sequences generated (prompts x samples per prompt)
}

# Column -> dtype of the range log (times are int64 ns, monotonic clock of the writing process).
RANGE_LOG_COLUMNS: dict[str, str] = {
    "range_id": "int64",
    "name": "string",
    "start_ns": "int64",
    "end_ns": "int64",
    "dur_ns": "int64",
    "tid": "int64",
    "depth": "int64",
    "parent_id": "int64",
    "attrs": "string",
}

# (v2) seconds: a sweep's wall time; an ingest's on the basis its ``seconds_basis`` names (the host window, or the
# device's completion interval once the host runs ahead of the GPU); gpu_busy_seconds: the GPU ops it launched
# (docs/contracts.md, the micro-batch table).
MICROBATCH_COLUMNS: dict[str, str] = {
    "model": "string",
    "precision": "string",  # docs/contracts.md precision id
    "phase": "string",  # canonical phase
    "tokens_per_microbatch": "int64",  # the size asked for: label, sweep setting, or detected
    "num_tokens": "int64",  # tokens actually processed in this micro-batch
    "step": "int64",
    "microbatch": "int64",  # index within its step (and phase), 0 = first
    "repeat": "int64",  # the resampling group: a sweep repeat, or one traced step of one rank
    "rank": "Int64",  # null when unknown
    "seconds": "float64",  # the basis above
    "gpu_busy_seconds": "Float64",  # null without a GPU trace
    "host_stall_seconds": "Float64",
    "source": "string",  # MICROBATCH_SOURCES
    "peak_mem_bytes": "Float64",  # extra: from a sweep / mxperf range attributes
    "flops": "Float64",  # extra
}
MICROBATCH_SOURCES: tuple[str, ...] = ("sweep", "range", "detected")
# microbatches.parquet ends with the trace each row came from (pandas' default string dtype, as written so far)
MICROBATCH_TRACE: dict[str, str] = {"trace": "str"}


def empty_frame(columns: Mapping[str, str]) -> pd.DataFrame:
    """A zero-row table with the given schema."""
    import pandas as pd

    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in columns.items()})


def conform(df: pd.DataFrame, columns: Mapping[str, str], table: str) -> pd.DataFrame:
    """Return ``df`` with exactly ``columns`` in order and dtype; a missing column raises InputError."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InputError(f"{table}: missing column(s) {', '.join(missing)}")
    from pandas.api.types import pandas_dtype

    out = df.loc[:, list(columns)]
    try:
        if not out.columns.is_unique:
            return out.astype(dict(columns))
        # astype leaves a column already of its dtype as it is (pandas' astype_array): cast only the others,
        # since a frame-wide astype rebuilds every column (most of this call's time on small tables)
        cast = {c: t for (c, t), d in zip(columns.items(), out.dtypes, strict=True) if d != pandas_dtype(t)}
        return out.astype(cast) if cast else out
    except (TypeError, ValueError) as exc:
        raise InputError(f"{table}: a column has the wrong type ({exc})") from None


# ------------------------------------------------------------------------------------------------ Arrow tables
# ``mxperf ingest`` builds every table as an Arrow table of the dtypes above (no pandas import), with the pandas
# metadata ``pyarrow.Table.from_pandas`` writes for a frame of those dtypes, so pandas reads them back as such.

# dtype -> (Arrow type name, pandas_type, numpy_type) of that metadata
_ARROW: dict[str, tuple[str, str, str]] = {
    "int64": ("int64", "int64", "int64"),
    "Int64": ("int64", "int64", "Int64"),
    "float64": ("float64", "float64", "float64"),
    "Float64": ("float64", "float64", "Float64"),
    "string": ("large_string", "object", "string"),
    "str": ("large_string", "object", "str"),
    "bool": ("bool_", "bool", "bool"),
}
NULLABLE = frozenset({"Int64", "Float64", "string", "str"})  # dtypes whose column may hold nulls


def arrow_type(dtype: str) -> pa.DataType:
    """The Arrow type of a column of ``dtype`` (``category``: a dictionary of large strings, int32 codes)."""
    import pyarrow as pa

    if dtype == "category":
        return pa.dictionary(pa.int32(), pa.large_string())
    try:
        return getattr(pa, _ARROW[dtype][0])()
    except KeyError:
        raise ValueError(f"no Arrow type for dtype {dtype!r}") from None


def codes_type(num_categories: int) -> str:
    """The integer type of a pandas categorical's codes (``pandas.core.dtypes.cast.coerce_indexer_dtype``)."""
    for name, top in (("int8", 127), ("int16", 32_767), ("int32", 2_147_483_647)):
        if num_categories < top:
            return name
    return "int64"


@functools.cache
def _pandas_version() -> str | None:
    """The installed pandas' version, found without importing it (or its package metadata: ~0.1 s)."""
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("pandas")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    site = Path(spec.origin).parent.parent
    found = [p.name[len("pandas-") : -len(".dist-info")] for p in site.glob("pandas-*.dist-info")]
    return found[0] if len(found) == 1 else None


def pandas_metadata(columns: Mapping[str, str], categories: Mapping[str, int] | None = None) -> bytes:
    """The ``pandas`` schema metadata of a frame with ``columns`` (name -> dtype; ``categories``: the number
    of categories of each ``category`` column), as ``pyarrow.Table.from_pandas`` writes it."""
    import pyarrow as pa

    entries = []
    for c, dtype in columns.items():
        if dtype == "category":
            n = (categories or {}).get(c, 0)
            kind, numpy, meta = "categorical", codes_type(n), {"num_categories": n, "ordered": False}
        else:
            _, kind, numpy = _ARROW[dtype]
            meta = None
        entries.append(
            {"name": c, "field_name": c, "pandas_type": kind, "numpy_type": numpy, "metadata": meta}
        )
    doc: dict[str, Any] = {
        "index_columns": [],
        "column_indexes": [],
        "columns": entries,
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
    }
    if _pandas_version() is not None:
        doc["pandas_version"] = _pandas_version()
    return json.dumps(doc).encode()


def arrow_schema(columns: Mapping[str, str]) -> pa.Schema:
    """The Arrow schema of a table of ``columns`` (no ``category`` columns), pandas metadata included."""
    import pyarrow as pa

    fields = [pa.field(c, arrow_type(t)) for c, t in columns.items()]
    return pa.schema(fields, metadata={b"pandas": pandas_metadata(columns)})


def _column(values: Any, dtype: str, n: int) -> pa.Array | pa.ChunkedArray:
    """``values`` (a sequence, numpy array, Arrow array or one scalar for all ``n`` rows) as Arrow ``dtype``."""
    import numpy as np
    import pyarrow as pa

    typ = arrow_type(dtype)
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        arr = values if values.type == typ else cast(values, typ)
    elif _scalar(values):
        arr = pa.array([values] * n, typ, from_pandas=True) if values is not None else pa.nulls(n, typ)
    elif isinstance(values, np.ndarray) and values.dtype != object:
        arr = pa.array(values, typ, from_pandas=True)  # NaN -> null, as a frame's NaN is written
    else:
        arr = pa.array(list(values), typ, from_pandas=True)
    if dtype == "Float64" and arr.null_count < len(arr):  # pandas' Float64 has no NaN: a NaN is missing
        floats = arr.to_numpy(zero_copy_only=False)  # (nulls as NaN)
        arr = pa.array(floats, typ, mask=np.isnan(floats))
    return arr


def _scalar(value: Any) -> bool:
    import numpy as np

    return value is None or isinstance(value, (str, int, float, np.generic))


def make_table(data: Mapping[str, Any], columns: Mapping[str, str], name: str = "table") -> pa.Table:
    """An Arrow table of exactly ``columns`` (in order, of their dtypes) from ``data`` (column -> values);
    a missing column or one that cannot take its dtype raises InputError naming ``name``."""
    import pyarrow as pa

    missing = [c for c in columns if c not in data]
    if missing:
        raise InputError(f"{name}: missing column(s) {', '.join(missing)}")
    n = next((len(v) for v in data.values() if not _scalar(v)), 0)
    try:
        arrays = [_column(data[c], t, n) for c, t in columns.items()]
    except (TypeError, ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(f"{name}: a column has the wrong type ({exc})") from None
    for (c, t), arr in zip(columns.items(), arrays, strict=True):
        if t not in NULLABLE and t != "float64" and arr.null_count:
            raise InputError(f"{name}: a column has the wrong type (column {c!r} of {t} holds nulls)")
    return pa.Table.from_arrays(arrays, schema=arrow_schema(columns))


def conform_table(table: pa.Table, columns: Mapping[str, str], name: str = "table") -> pa.Table:
    """``table`` with exactly ``columns`` in order and type, pandas metadata included (:func:`make_table`)."""
    return make_table({c: table.column(c) for c in columns if c in table.column_names}, columns, name)


def dtypes_of(table: pa.Table) -> dict[str, str]:
    """Column -> dtype of a table made here (read from its pandas metadata: :func:`make_table`)."""
    doc = json.loads((table.schema.metadata or {})[b"pandas"])
    by_numpy = {numpy: dtype for dtype, (_, _, numpy) in _ARROW.items()}
    known = {
        e["name"]: "category" if e["pandas_type"] == "categorical" else by_numpy[e["numpy_type"]]
        for e in doc["columns"]
    }
    return {c: known[c] for c in table.column_names}


def empty_table(columns: Mapping[str, str]) -> pa.Table:
    """A zero-row Arrow table with the given schema."""
    return arrow_schema(columns).empty_table()


def to_frame(table: pa.Table) -> pd.DataFrame:
    """An Arrow table of these schemas as the pandas frame notebooks get (its metadata gives the dtypes)."""
    return table.to_pandas()


def column(table: pa.Table, name: str) -> Any:
    """One column of an Arrow table as numpy (strings as an object array; nulls as None, or NaN in floats)."""
    return table.column(name).to_numpy()


def from_frame(df: pd.DataFrame) -> pa.Table:
    """A frame a notebook passed in, as the Arrow table the functions inside work on."""
    import pyarrow as pa

    return pa.Table.from_pandas(df, preserve_index=False)


def is_arrow(table: object) -> bool:
    """An Arrow table (not a pandas frame)."""
    return hasattr(table, "column_names") and hasattr(table, "num_rows")


def rows_where(table: pa.Table, mask: Any) -> pa.Table:
    """The rows of ``table`` where the boolean ``mask`` (numpy) is true, in order.

    This helper and :func:`take` and :func:`cast` call Arrow's kernels through ``pyarrow._compute``:
    ``Table.filter`` & co. import ``pyarrow.compute``, whose Python wrappers cost ~30 ms of every ingest."""
    import numpy as np
    import pyarrow as pa
    import pyarrow._compute as kernels

    return kernels.call_function("filter", [table, pa.array(np.asarray(mask, bool))])


def take(values: Any, indices: Any) -> Any:
    """``values`` (an Arrow array or table) at the positions ``indices`` (numpy ints), in that order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow._compute as kernels

    return kernels.call_function("take", [values, pa.array(np.asarray(indices, np.int64))])


def cast(values: Any, to: Any) -> Any:
    """``values`` (an Arrow array, chunked array or table) cast to ``to`` (a type, or a table's schema)."""
    import pyarrow._compute as kernels

    if hasattr(values, "schema"):  # a table: each column
        import pyarrow as pa

        cols = [cast(values.column(i), f.type) for i, f in enumerate(to)]
        return pa.Table.from_arrays(cols, schema=to)
    return kernels.call_function("cast", [values], kernels.CastOptions.safe(to))


def fill_null(values: Any, value: Any) -> Any:
    """``values`` (an Arrow array) with its nulls replaced by ``value``."""
    import pyarrow as pa
    import pyarrow._compute as kernels

    return kernels.call_function("coalesce", [values, pa.scalar(value, values.type)])


def factorize(table: pa.Table, name: str) -> tuple[Any, list[Any]]:
    """Codes (int64 numpy, in order of first appearance) and the distinct values of one column, with no
    Python object per row (a range table of an nsys export holds a row per op); a null is a value (None)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow._compute as kernels  # as rows_where does

    col = table.column(name)
    if pa.types.is_dictionary(col.type):
        col = cast(col, col.type.value_type)
    options = kernels.DictionaryEncodeOptions(null_encoding="encode")
    enc = kernels.call_function("dictionary_encode", [col], options).combine_chunks()
    if not isinstance(enc, pa.DictionaryArray):  # an empty column
        return np.zeros(0, np.int64), []
    return enc.indices.to_numpy(zero_copy_only=False).astype(np.int64), enc.dictionary.to_pylist()
