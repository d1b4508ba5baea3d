"""Every file mxperf writes or reads in an output directory: names, atomic writes, schema_version.

The only module that touches Parquet. Tables are written to a temporary name in the same directory and
renamed when complete, so a crash never leaves a half-written table under its real name. Every table
carries ``schema_version`` in its Parquet key-value metadata; every JSON file carries it as a key. The
output directory layout: docs/contracts.md, "Output directories".
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import tempfile
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracing.outputs.errors import InputError, OutputWriteError

if TYPE_CHECKING:  # pandas / pyarrow load when a table is read or written, not when a manifest is
    import numpy as np
    import pandas as pd
    import pyarrow as pa

SCHEMA_VERSION = 1


@contextlib.contextmanager
def arrow_without_pandas() -> Iterator[None]:
    """Keep pandas out of a command that builds Arrow tables only (``mxperf ingest`` / ``ranges``): importing
    it is ~0.4-0.7 s of a 1 MB trace's whole ingest.

    pyarrow imports pandas the first time it converts anything, and goes on without it when it finds no usable
    pandas. While this is active ``sys.modules["pandas"]`` is a stand-in (:class:`_NoPandas`) that pyarrow's
    shim is made to probe at once and reject (too old); code that uses pandas then fails (:data:`NO_PANDAS`).
    A process that imported pandas already, or a pyarrow whose shim is not as expected, is left as it is."""
    if "pandas" in sys.modules:
        yield
        return
    stand_in = _NoPandas("pandas")
    sys.modules["pandas"] = stand_in
    try:
        if not _pyarrow_shim_without_pandas():
            del sys.modules["pandas"]
        yield
    finally:
        if sys.modules.get("pandas") is stand_in:
            del sys.modules["pandas"]


NO_PANDAS = "this command keeps pandas out of its process (it builds Arrow tables only), yet a step used it"


class _NoPandas(types.ModuleType):
    """``sys.modules["pandas"]`` while :func:`arrow_without_pandas` is active: no attribute at all."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{NO_PANDAS} (pandas.{name})")


def _pyarrow_shim_without_pandas() -> bool:
    """Make pyarrow's pandas shim probe now, with the stand-in in ``sys.modules``, and say whether it
    concluded that there is no pandas (it then never probes again in this process)."""
    import warnings

    import pyarrow.lib

    shim = getattr(pyarrow.lib, "_pandas_api", None)
    stand_in = sys.modules["pandas"]
    compat = "pyarrow.pandas_compat"
    stub_compat = compat not in sys.modules  # the shim imports it with pandas; it needs none of it here
    if stub_compat:
        sys.modules[compat] = types.ModuleType(compat)
    stand_in.__version__ = "0"  # older than pyarrow supports: "pandas-specific integration is not used"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return shim is not None and shim.have_pandas is False
    except Exception:  # a pyarrow whose shim works otherwise: let it import pandas
        return False
    finally:
        del stand_in.__version__
        if stub_compat:
            del sys.modules[compat]


# File names, named once.
MANIFEST = "manifest.json"
METRICS = "metrics.parquet"
RANGES = "ranges.parquet"
SYNC_CHECKS = "sync_checks.parquet"
EVAL_FIXED_WEIGHTS = "eval_fixed_weights.parquet"
MICROBATCHES = "microbatches.parquet"
DEVICES = "devices.parquet"
KERNELS = "kernels.parquet"
EVENTS_DIR = "events"
TRACE_DIR = "trace"
SAMPLER_TRACE_DIR = "sampler"  # trace/sampler/: a sampler process's own profiler traces (vLLM)
FITS = "fits.json"
REPORT = "report.md"
FAULT_MATRIX = "fault_matrix.parquet"
CONSISTENCY = "consistency.parquet"
STREAMS = "streams.parquet"  # ingest: HTA-style idle breakdown per (device, stream)
STEPS = "steps.parquet"  # ingest: seconds per (rank, process, step, phase)
MISMATCH = "mismatch.parquet"  # ingest of a metric log: sampler/learner mismatch metrics per step
STEP_TOKENS = "step_tokens.parquet"  # ingest of a metric log: per step prompt / generated tokens, sequences
STRAGGLERS = "stragglers.parquet"  # ingest of several ranks: the slowest rank of each step
RANK_SPREAD = "rank_spread.parquet"  # ingest of several ranks: busy / host stall spread per device index


def trace_path(out_dir: Path, rank: int) -> Path:
    return Path(out_dir) / TRACE_DIR / f"rank-{rank}.json.gz"


def events_path(out_dir: Path, rank: int | str) -> Path:
    return Path(out_dir) / EVENTS_DIR / f"rank-{rank}.parquet"


def umask() -> int:
    """The process's umask (read by setting it, then set back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~umask()


@contextlib.contextmanager
def atomic(path: Path) -> Iterator[str]:
    """A temp file (:func:`atomic_target`) to write in the block: renamed to ``path`` when the block ends, removed
    when it raises; an OSError names ``path`` (:func:`writing`)."""
    fd, tmp = atomic_target(path)
    os.close(fd)
    try:
        with writing(path):
            yield tmp
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """An OSError inside (read-only or full disk, no permission) becomes :class:`OutputWriteError` naming
    ``path`` -- the file meant, not a temp name."""
    try:
        yield
    except OutputWriteError:
        raise
    except OSError as exc:
        from tracing.outputs.errors import shown

        raise OutputWriteError(f"{shown(path)}: cannot write ({exc.strerror or exc})") from None


def atomic_target(path: Path) -> tuple[int, str]:
    """A temp file beside ``path`` (same filesystem, so the final rename is atomic), with the mode a
    plain ``open`` would give (mkstemp's 0600 would make shared result folders unreadable)."""
    with writing(path):
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "is a directory; give a file name", str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, _FILE_MODE)
    return fd, tmp


def write_table(
    df: pd.DataFrame | pa.Table, path: str | os.PathLike[str], meta: Mapping[str, Any] | None = None
) -> Path:
    """Write ``df`` (a frame, or an Arrow table: ``schema.make_table``) to Parquet atomically, with
    ``schema_version`` (and ``meta``) in the file metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    table = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata(_file_metadata(table.schema, meta))
    with atomic(path) as tmp:
        pq.write_table(table, tmp, **parquet_options(table.schema))
    return path


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How every table is written: dictionary pages for categorical and text columns only (an int64 column such
    as ``start_ns`` has nearly as many values as rows: trying a dictionary for each costs several times the
    write of the events table and saves nothing)."""
    import pyarrow as pa

    coded = (pa.types.is_dictionary, pa.types.is_string, pa.types.is_large_string)
    return {"use_dictionary": [f.name for f in schema if any(t(f.type) for t in coded)]}


def _file_metadata(schema: pa.Schema, meta: Mapping[str, Any] | None) -> dict[bytes, bytes]:
    kv = dict(schema.metadata or {})
    kv[b"schema_version"] = str(SCHEMA_VERSION).encode()
    if meta:
        kv[b"mxperf"] = json.dumps(dict(meta), default=str).encode()
    return kv


def write_table_parts(
    frames: Iterable[pd.DataFrame | pa.Table],
    path: str | os.PathLike[str],
    meta: Mapping[str, Any] | None = None,
) -> tuple[Path, int]:
    """:func:`write_table` for a table that arrives in parts (same columns and dtypes, categoricals with the
    same categories): one row group per part, so only one part is in memory. Returns (path, rows).

    After the first part, a frame part's categoricals go out with only the categories it uses (a reader unifies
    the row groups' dictionaries in order: the table read back is the same). A part may come as the Arrow table
    its frame converts to (:func:`coded_table`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tracing.outputs import schema as tables

    path = Path(path)
    writer, rows = None, 0
    with atomic(path) as tmp:
        try:
            for df in frames:
                if writer is None:
                    table = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
                    schema = table.schema.with_metadata(_file_metadata(table.schema, meta))
                    writer = pq.ParquetWriter(tmp, schema, **parquet_options(schema))
                else:
                    table = (
                        df
                        if isinstance(df, pa.Table)
                        else pa.Table.from_pandas(_used_categories(df), preserve_index=False)
                    )
                    if not table.schema.equals(schema):  # fewer categories: e.g. int8 codes, not int16
                        table = tables.cast(table, schema)
                writer.write_table(table.replace_schema_metadata(schema.metadata))
                rows += len(df)
            if writer is None:
                raise ValueError("write_table_parts: no parts")
        finally:
            if writer is not None:
                writer.close()
    return path, rows


def coded_table(
    columns: Mapping[str, np.ndarray],
    categories: Mapping[str, Sequence[str]],
    carry: Mapping[str, np.ndarray] | None = None,
) -> pa.Table:
    """``pa.Table.from_pandas`` of the frame of ``columns`` (int64 arrays, and category codes, -1 missing, for
    the columns named in ``categories``) with those columns categoricals over ``categories``, made without
    pandas' categoricals (which hash every category: 300 MB and 1.5 s a part for an export of distinct names).

    ``carry``: for some of those columns, the sorted codes of the categories this part's dictionary holds
    (:class:`CarriedCategories`); index type and metadata stay the whole table's, so parts share one schema."""
    import numpy as np
    import pyarrow as pa

    from tracing.outputs import schema

    dtypes = {c: "category" if c in categories else "int64" for c in columns}
    counts = {c: len(v) for c, v in categories.items()}
    arrays, fields = [], []
    for col in columns:
        values = np.asarray(columns[col])
        if col not in categories:
            arrays.append(pa.array(values, pa.int64()))
            fields.append(pa.field(col, pa.int64()))
            continue
        codes, cats = values.astype(np.int64), categories[col]
        index = getattr(pa, schema.codes_type(len(cats)))()
        if carry is not None and col in carry:
            kept = carry[col]
            codes = np.where(codes >= 0, np.searchsorted(kept, codes), -1)
            cats = [cats[i] for i in kept.tolist()]
        arrays.append(
            pa.DictionaryArray.from_arrays(
                pa.array(codes, index, mask=codes < 0), pa.array(cats, pa.large_string())
            )
        )
        fields.append(pa.field(col, pa.dictionary(index, pa.large_string())))
    kv = {b"pandas": schema.pandas_metadata(dtypes, counts)}
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=kv))


class CarriedCategories:
    """Which categories each part of a table written in parts carries, so that a reader (which unifies the row
    groups' dictionaries in order) gets every category in code order while no part holds them all: a part
    carries the ones it uses and every one from the previous parts' highest code up to its own (the last part:
    up to the end)."""

    def __init__(self, sizes: Mapping[str, int]) -> None:
        self.sizes = dict(sizes)
        self.frontier = dict.fromkeys(sizes, 0)  # codes below this are in an earlier part's dictionary

    def carry(self, codes: Mapping[str, np.ndarray], last: bool) -> dict[str, np.ndarray]:
        """The sorted codes the next part carries, per column, given the codes it uses."""
        import numpy as np

        out = {}
        for col, size in self.sizes.items():
            used = np.unique(np.asarray(codes[col]))
            used = used[used >= 0]
            lo = self.frontier[col]
            hi = size if last else max(lo, int(used[-1]) + 1 if len(used) else 0)
            out[col] = np.union1d(used[used < lo], np.arange(lo, hi))
            self.frontier[col] = hi
        return out


def _used_categories(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with each categorical column's unused categories dropped (order kept); other columns shared."""
    import pandas as pd

    cats = [c for c in df.columns if isinstance(df[c].dtype, pd.CategoricalDtype)]
    if not cats:
        return df
    return df.assign(**{c: df[c].cat.remove_unused_categories() for c in cats})


def read_table(
    path: str | os.PathLike[str], columns: list[str] | None = None, *, foreign: bool = False
) -> pd.DataFrame:
    """Read a table mxperf wrote; a missing, corrupt or newer-schema file raises InputError naming it.
    ``foreign=True``: a table any tool wrote (a user's own Parquet): no ``schema_version`` needed."""
    return read_arrow(path, columns, foreign=foreign).to_pandas()


def read_arrow(
    path: str | os.PathLike[str], columns: list[str] | None = None, *, foreign: bool = False
) -> pa.Table:
    """:func:`read_table` as an Arrow table (no pandas: what the ``mxperf`` commands read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such table")
    try:
        pf = pq.ParquetFile(path)
        version = (pf.schema_arrow.metadata or {}).get(b"schema_version")
        table = pf.read(columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"{path}: not a readable Parquet table ({exc})") from None
    if version is None:
        if not foreign:
            raise InputError(f"{path}: no schema_version in the Parquet metadata; not written by mxperf")
    elif int(version) > SCHEMA_VERSION:
        raise InputError(
            f"{path}: schema_version {int(version)} is newer than this mxperf ({SCHEMA_VERSION})"
        )
    return table


def table_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``meta`` mapping stored by :func:`write_table` (empty when none)."""
    import pyarrow.parquet as pq

    raw = (pq.read_schema(path).metadata or {}).get(b"mxperf")
    return json.loads(raw) if raw else {}


def write_json(obj: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write JSON atomically; ``schema_version`` is added when missing."""
    path = Path(path)
    data = {"schema_version": SCHEMA_VERSION, **obj}
    with atomic(path) as tmp, open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, default=str, allow_nan=False)
        fh.write("\n")
    return path


def write_text(text: str, path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    with atomic(path) as tmp, open(tmp, "w") as fh:
        fh.write(text)
    return path


def read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object at the top level")
    return data
