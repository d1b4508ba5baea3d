"""Golden references of ``mxperf ingest``: today's outputs frozen per case, and the comparison a rewrite of the
trace engine is held to (``tests/data/golden/``; README there says what is frozen and when it may change).

A case is one ingest input exactly as a user gives it (``mxperf ingest INPUT -o OUT --json``, ``--stream off``
and ``--stream on``): each real trace of ``tests/data/real/``, each quirk fixture of ``tests/data/quirks/``, and
synthetic traces from ``tests/synthetic_traces.py`` (generated at test time with fixed seeds; only their input
digest and truth are stored). Per case the golden folder holds:

- every table the ingest writes (``devices``, ``streams``, ``ranges``, ``kernels``, ``steps``, and
  ``microbatches`` / ``stragglers`` / ``rank_spread`` where it writes them) as zstd Parquet;
- ``summary.json``: the ``--json`` line, the result fields of ``manifest.json`` (per trace: devices,
  micro-batch counts and notes, phases, precision evidence, warnings, GPU names; the file list), a digest
  of each event table (row count, per-column dtype, null count and an order-independent checksum, and one
  over whole rows), and for a synthetic case the digest of its generated input and its truth.

Paths are made neutral: every input's folder (as given and resolved) is cut from strings, so
``/tmp/x/hta_sampled_2rank/rank-0.json.gz`` reads ``hta_sampled_2rank/rank-0.json.gz``.

:func:`compare` is order-insensitive: tables are compared after sorting both sides by the table's key
columns (then every other column), trace entries of the JSON documents by path and devices by (pid, device),
event tables by an order-independent checksum. Integers, strings and booleans must be equal exactly, floats
within rel 1e-9 (NaN equals NaN), nulls only nulls; column names, column order and pandas dtypes too. Row order
is not checked here: docs/contracts.md guarantees none for these tables (the micro-batch table's ``microbatch``
index and the ranges' ``range_id`` / ``parent_id`` are values, compared as such); where a test needs an order
it checks it separately.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import math
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
GOLDEN = DATA / "golden"
SUMMARY = "summary.json"
REL_TOL = 1e-9
STREAM_MODES = ("off", "on")
MAX_SHOWN = 3  # differing rows named per column

# Sort keys per table (then every other non-float column, then the floats): what identifies a row.
KEYS: dict[str, tuple[str, ...]] = {
    "devices.parquet": ("trace", "rank", "pid", "device"),
    "streams.parquet": ("trace", "rank", "pid", "device", "stream"),
    "ranges.parquet": ("trace", "rank", "pid", "tid", "start_ns", "end_ns", "name", "range_id"),
    "kernels.parquet": ("trace", "rank", "device", "kind", "name"),
    "steps.parquet": ("trace", "rank", "pid", "step", "phase"),
    "microbatches.parquet": ("rank", "phase", "step", "microbatch", "repeat"),
    "stragglers.parquet": ("step",),
    "rank_spread.parquet": ("device",),
    "mismatch.parquet": ("trace", "step", "metric", "key"),
}
# Manifest fields that describe the result (not when, where, by which version, or how long).
MANIFEST_TOP = ("kind", "status", "microbatches", "notes", "files")


# --------------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One ingest input; ``make(workdir)`` returns the paths given to ``mxperf ingest`` and, for a synthetic
    case, facts about the generated input (its digest and truth) that must stay as frozen."""

    name: str
    make: Callable[[Path], tuple[list[Path], dict[str, Any] | None]]


def _given(*paths: Path) -> Callable[[Path], tuple[list[Path], None]]:
    return lambda _work: (list(paths), None)


def _nsys_quirk(work: Path) -> tuple[list[Path], None]:
    path = work / "nsys_unmatched_push_pop.sqlite"  # built as tests/unit/test_tracing_quirks.py does
    con = sqlite3.connect(path)
    con.executescript((DATA / "quirks" / "nsys_unmatched_push_pop" / "schema.sql").read_text())
    con.close()
    return [path], None


SYNTH_STEPS = ((2048, 1024, (4, 512)), (4096, 512, 512, 768))


def _synthetic(framework: str, precision: str, ranks: int = 1) -> Callable[[Path], tuple[list[Path], dict]]:
    """A simulated rank (or ``ranks`` ranks, one file each in one folder) with fixed seeds."""

    def make(work: Path) -> tuple[list[Path], dict]:
        import synthetic_traces as st

        nsys = framework == "nemo-rl"
        folder = work / f"{framework}-{precision}"
        files, truth = [], []
        for r in range(ranks):
            job = st.Job(
                framework=framework,
                precision=precision,
                steps=SYNTH_STEPS,
                minibatches=1 if nsys else 2,
                rank=r,
                seed=7 + r,
            )
            rank = st.simulate(job)
            if nsys:  # the name NeMo RL's worker gives its export (as tests/integration does)
                files.append(
                    st.write_nsys_sqlite([rank], folder / f"dtensor_policy_worker_v2_{r}:5_4242.sqlite")
                )
            else:
                files.append(st.write_kineto(rank, folder / f"rank-{r}.json.gz", world_size=ranks))
            # the host-window truth frozen in the goldens (the device truth added in #32 is derived from the
            # same generated input, whose digest is frozen above)
            truth += [{"rank": r, **{k: getattr(t, k) for k in st.HOST_TRUTH}} for t in rank.truth]
        facts = {
            "framework": framework,
            "precision": precision,
            "steps": [list(s) for s in SYNTH_STEPS],
            "ranks": ranks,
            "input_digest": {f.name: input_digest(f) for f in files},
            "truth": truth,
        }
        return ([folder] if ranks > 1 else files), json.loads(json.dumps(facts))  # tuples as JSON has them

    return make


_QUIRKS = ("cross_thread_ranges", "no_gpu_ops", "no_launch_records", "ns_resolution", "same_stream_overlap")
CASES: tuple[Case, ...] = (
    Case("real_hta_a100_ddp_rank0_hostbound", _given(DATA / "real" / "hta_a100_ddp_rank0_hostbound.json.gz")),
    Case("real_hta_sampled_2rank", _given(DATA / "real" / "hta_sampled_2rank")),
    Case("real_nsysai_h100x2_mfu_before", _given(DATA / "real" / "nsysai_h100x2_mfu_before.sqlite")),
    *(Case(f"quirk_{q}", _given(DATA / "quirks" / q / "trace.json")) for q in _QUIRKS),
    Case("quirk_nsys_unmatched_push_pop", _nsys_quirk),
    *(
        Case(f"synth_{fw.replace('-', '_')}_{p}", _synthetic(fw, p))
        for fw in ("verl-fsdp", "verl-megatron", "nemo-rl")
        for p in ("bf16", "mxfp8")
    ),
    Case("synth_verl_fsdp_bf16_2rank", _synthetic("verl-fsdp", "bf16", ranks=2)),
)
CASE_NAMES = tuple(c.name for c in CASES)
# (case, table or "summary") whose --stream on output is allowed to differ from --stream off's (golden):
# none today; an entry needs the reason in tests/data/golden/README.md.
STREAM_DIFFERENCES: frozenset[tuple[str, str]] = frozenset()


def case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def input_digest(path: Path) -> str:
    """sha256 of a generated input's content: a gzip file's decompressed bytes (its header holds a time), an
    SQLite file's SQL dump (its pages depend on the SQLite version), else the bytes."""
    h = hashlib.sha256()
    if path.name.endswith(".gz"):
        h.update(gzip.decompress(path.read_bytes()))
    elif path.suffix == ".sqlite":
        con = sqlite3.connect(path)
        try:
            for line in con.iterdump():
                h.update(line.encode())
                h.update(b"\n")
        finally:
            con.close()
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------- running


@dataclass
class Ingested:
    out: Path
    json_line: str
    inputs: list[Path]
    facts: dict[str, Any] | None
    stderr: str


def ingest(c: Case, work: Path, stream: str) -> Ingested:
    """``mxperf ingest INPUT -o OUT --json --stream MODE``, in-process (``mxperf.cli.main``), into ``work``."""
    from mxperf.cli import main

    work.mkdir(parents=True, exist_ok=True)
    inputs, facts = c.make(work)
    inputs = [p.resolve() for p in inputs]
    out = work / f"out-{stream}"
    argv = ["ingest", *map(str, inputs), "-o", str(out), "--json", "--stream", stream]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    if code != 0:
        raise RuntimeError(f"mxperf {' '.join(argv)} exited {code}:\n{stderr.getvalue()}")
    line = stdout.getvalue().strip().splitlines()[-1]
    return Ingested(out, line, inputs, facts, stderr.getvalue())


# --------------------------------------------------------------------------------------------- neutral paths


def _prefixes(out_dir: Path) -> list[str]:
    """The folders of the ingest's inputs (from its manifest), as given and resolved, longest first."""
    manifest = json.loads((Path(out_dir) / "manifest.json").read_text())
    found = set()
    for p in manifest.get("config", {}).get("paths", []):
        for parent in (Path(p).parent, Path(p).resolve().parent):
            text = str(parent)
            if text not in ("", "."):
                found.add(text.rstrip("/") + "/")
    return sorted(found, key=len, reverse=True)


def _neutral_text(s: str, prefixes: list[str]) -> str:
    for p in prefixes:
        s = s.replace(p, "")
    return s


def _neutral_json(obj: Any, prefixes: list[str]) -> Any:
    if isinstance(obj, str):
        return _neutral_text(obj, prefixes)
    if isinstance(obj, list):
        return [_neutral_json(v, prefixes) for v in obj]
    if isinstance(obj, dict):
        return {k: _neutral_json(v, prefixes) for k, v in obj.items()}
    return obj


def _neutral_frame(df: pd.DataFrame, prefixes: list[str]) -> pd.DataFrame:
    df = df.copy()
    for col in df.columns:
        s = df[col]
        if isinstance(s.dtype, pd.CategoricalDtype):
            cats = [_neutral_text(str(c), prefixes) for c in s.cat.categories]
            if cats != [str(c) for c in s.cat.categories] and len(set(cats)) == len(cats):
                df[col] = s.cat.rename_categories(cats)
        elif pd.api.types.is_string_dtype(s.dtype) or s.dtype == object:
            mask = s.notna()
            if mask.any():
                new = s.copy()
                new[mask] = [_neutral_text(v, prefixes) if isinstance(v, str) else v for v in s[mask]]
                df[col] = new.astype(s.dtype)
    return df


# --------------------------------------------------------------------------------------------- summaries


def _sort_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """A JSON document's traces by path, each trace's devices by (pid, device): order is not a result."""
    doc = dict(doc)
    traces = []
    for t in doc.get("traces", []):
        t = dict(t)
        if isinstance(t.get("devices"), list):
            t["devices"] = sorted(t["devices"], key=lambda d: (str(d.get("pid")), d.get("device", -1)))
        traces.append(t)
    if "traces" in doc:
        doc["traces"] = sorted(traces, key=lambda t: str(t.get("path")))
    return doc


def manifest_results(out_dir: Path) -> dict[str, Any]:
    """The manifest's result fields, paths neutral (no times, versions, git sha, command, machine)."""
    manifest = json.loads((Path(out_dir) / "manifest.json").read_text())
    doc = {k: manifest.get(k) for k in MANIFEST_TOP}
    doc["files"] = sorted(doc["files"] or [])
    doc["traces"] = manifest.get("traces", [])
    return _sort_doc(_neutral_json(doc, _prefixes(out_dir)))


def _canonical(s: pd.Series) -> np.ndarray:
    """One column's values in a dtype-independent form for hashing: integers as int64 (null -> min int64),
    floats as float64, anything else as text (null -> a marker)."""
    if pd.api.types.is_bool_dtype(s.dtype) or pd.api.types.is_integer_dtype(s.dtype):
        return s.astype("Int64").fillna(np.iinfo(np.int64).min).to_numpy(dtype=np.int64)
    if pd.api.types.is_float_dtype(s.dtype):
        return s.astype("float64").to_numpy(dtype=np.float64, na_value=np.nan)
    return np.array(
        [
            "\x00<null>" if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else str(v)
            for v in s.astype(object)
        ],
        dtype=object,
    )


def table_digest(df: pd.DataFrame) -> dict[str, Any]:
    """Row count and, per column, dtype, nulls and an order-independent checksum (sum of per-row hashes mod
    2^64), plus one over whole rows (so the columns' values must also pair up the same way)."""
    from pandas.util import hash_array

    rows = np.zeros(len(df), dtype=np.uint64)
    columns = {}
    with np.errstate(over="ignore"):
        for i, col in enumerate(df.columns):
            values = _canonical(df[col])
            h = hash_array(values, categorize=False)
            columns[col] = {
                "dtype": str(df[col].dtype),
                "nulls": int(df[col].isna().sum()),
                "checksum": f"{int(h.sum(dtype=np.uint64)):016x}",
            }
            present = df[col].dropna()
            if values.dtype == np.int64 and len(present):  # readable bounds for a message
                columns[col].update(min=int(present.min()), max=int(present.max()))
            rows = (rows ^ h) * np.uint64(0x100000001B3 + 2 * i)
        whole = hash_array(rows, categorize=False).sum(dtype=np.uint64) if len(df) else np.uint64(0)
    return {"rows": len(df), "columns": columns, "rows_checksum": f"{int(whole):016x}"}


def event_tables(out_dir: Path) -> list[Path]:
    return sorted((Path(out_dir) / "events").glob("*.parquet"))


def result_tables(out_dir: Path) -> list[str]:
    """The tables to freeze: every Parquet file at the top of the output (the event tables are digested)."""
    return sorted(p.name for p in Path(out_dir).glob("*.parquet"))


def _read(path: Path) -> pd.DataFrame:
    from tracing.outputs import store

    return store.read_table(path)


def summary(out_dir: Path, json_line: str | None, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    out_dir = Path(out_dir)
    prefixes = _prefixes(out_dir)
    doc: dict[str, Any] = {
        "json": None if json_line is None else _sort_doc(_neutral_json(json.loads(json_line), prefixes)),
        "manifest": manifest_results(out_dir),
        "tables": result_tables(out_dir),
        "events": {
            str(p.relative_to(out_dir)): table_digest(_neutral_frame(_read(p), prefixes))
            for p in event_tables(out_dir)
        },
    }
    if facts is not None:
        doc["input"] = facts
    return doc


# --------------------------------------------------------------------------------------------- freezing


def freeze(out_dir: Path, golden_dir: Path, json_line: str, facts: dict[str, Any] | None = None) -> None:
    """Write ``golden_dir`` from one ingest output (replacing what was there)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tracing.outputs import store

    out_dir, golden_dir = Path(out_dir), Path(golden_dir)
    if golden_dir.exists():
        shutil.rmtree(golden_dir)
    golden_dir.mkdir(parents=True)
    prefixes = _prefixes(out_dir)
    for name in result_tables(out_dir):
        df = _neutral_frame(_read(out_dir / name), prefixes)
        table = pa.Table.from_pandas(df, preserve_index=False)
        meta = dict(table.schema.metadata or {})
        meta[b"schema_version"] = str(store.SCHEMA_VERSION).encode()
        pq.write_table(table.replace_schema_metadata(meta), golden_dir / name, compression="zstd")
    doc = summary(out_dir, json_line, facts)
    (golden_dir / SUMMARY).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


# --------------------------------------------------------------------------------------------- comparing


def _is_float(s: pd.Series) -> bool:
    return pd.api.types.is_float_dtype(s.dtype)


def _sort_frame(df: pd.DataFrame, name: str) -> pd.DataFrame:
    keys = [c for c in KEYS.get(name, ()) if c in df.columns]
    rest = [c for c in df.columns if c not in keys and not _is_float(df[c])]
    floats = [c for c in df.columns if c not in keys and _is_float(df[c])]
    proxy = pd.DataFrame(index=df.index)
    for i, c in enumerate([*keys, *rest, *floats]):
        s = df[c]
        if isinstance(s.dtype, pd.CategoricalDtype) or s.dtype == object:
            s = s.astype("string")
        proxy[i] = s
    if not len(proxy.columns):
        return df.reset_index(drop=True)
    order = proxy.sort_values(list(proxy.columns), na_position="first", kind="mergesort").index
    return df.loc[order].reset_index(drop=True)


def _shown(v: Any) -> str:
    """A cell as a message shows it: plain Python values, ``null`` for a missing one."""
    if v is None or v is pd.NA:
        return "null"
    return repr(v.item() if isinstance(v, np.generic) else v)


def _row_label(df: pd.DataFrame, name: str, i: int) -> str:
    keys = [c for c in KEYS.get(name, ()) if c in df.columns] or list(df.columns[:4])
    return ", ".join(f"{k}={_shown(df[k].iloc[i])}" for k in keys)


def _column_diff(got: pd.Series, want: pd.Series) -> np.ndarray:
    """Boolean mask of rows that differ (null only equals null; floats within REL_TOL, NaN == NaN)."""
    gn, wn = got.isna().to_numpy(), want.isna().to_numpy()
    diff = gn != wn
    both = ~gn & ~wn
    if _is_float(got) and _is_float(want):
        g = got.to_numpy(dtype=np.float64, na_value=np.nan)
        w = want.to_numpy(dtype=np.float64, na_value=np.nan)
        close = np.isclose(g, w, rtol=REL_TOL, atol=0.0, equal_nan=True)
        diff |= both & ~close
    else:
        g = got.astype(object).to_numpy()
        w = want.astype(object).to_numpy()
        for i in np.flatnonzero(both):
            diff[i] = bool(g[i] != w[i])
    return diff


def compare_tables(got: pd.DataFrame, want: pd.DataFrame, name: str) -> list[str]:
    """Differences between one table of an output and its golden copy, order-insensitive."""
    if list(got.columns) != list(want.columns):
        missing = [c for c in want.columns if c not in got.columns]
        extra = [c for c in got.columns if c not in want.columns]
        return [
            f"{name}: columns differ: got {list(got.columns)}, golden {list(want.columns)}"
            + (f" (missing {missing})" if missing else "")
            + (f" (extra {extra})" if extra else "")
        ]
    out = [
        f"{name}: column {c!r} dtype {got[c].dtype} (golden {want[c].dtype})"
        for c in got.columns
        if str(got[c].dtype) != str(want[c].dtype)
    ]
    if len(got) != len(want):
        return [*out, f"{name}: {len(got)} rows (golden {len(want)})"]
    got, want = _sort_frame(got, name), _sort_frame(want, name)
    for c in got.columns:
        mask = _column_diff(got[c], want[c])
        if not mask.any():
            continue
        rows = np.flatnonzero(mask)
        shown = "; ".join(
            f"row {i} ({_row_label(want, name, i)}): got {_shown(got[c].iloc[i])}, golden {_shown(want[c].iloc[i])}"
            for i in rows[:MAX_SHOWN]
        )
        out.append(f"{name}: column {c!r}: {len(rows)} of {len(got)} rows differ (sorted by key); {shown}")
    return out


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return False
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0)
    return type(a) is type(b) and a == b


def compare_json(got: Any, want: Any, where: str) -> list[str]:
    """Differences between two JSON values (floats within REL_TOL), each named by its path."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            if k not in got:
                out.append(f"{where}.{k}: missing (golden {json.dumps(want[k])[:200]})")
            elif k not in want:
                out.append(f"{where}.{k}: not in golden (got {json.dumps(got[k])[:200]})")
            else:
                out += compare_json(got[k], want[k], f"{where}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items (golden {len(want)}): got {json.dumps(got)[:300]}"]
        return [
            d
            for i, (g, w) in enumerate(zip(got, want, strict=True))
            for d in compare_json(g, w, f"{where}[{i}]")
        ]
    if _close(got, want):
        return []
    return [f"{where}: got {json.dumps(got)[:300]}, golden {json.dumps(want)[:300]}"]


def compare(
    out_dir: str | Path,
    golden_dir: str | Path,
    json_line: str | None = None,
    facts: dict[str, Any] | None = None,
) -> list[str]:
    """Human-readable differences between an ingest output and its golden folder; empty when equal.

    ``json_line``: the ingest's ``--json`` stdout line, compared too when given; ``facts``: a synthetic
    case's generated input digest and truth, compared when given (so a change of the generator is named as
    such, not as an engine change)."""
    out_dir, golden_dir = Path(out_dir), Path(golden_dir)
    if not (golden_dir / SUMMARY).is_file():
        return [f"{golden_dir}: no golden {SUMMARY} (freeze it with scripts/golden_tables.py --write)"]
    golden = json.loads((golden_dir / SUMMARY).read_text())
    prefixes = _prefixes(out_dir)
    diffs: list[str] = []
    if facts is not None:
        diffs += compare_json(facts, golden.get("input"), "input")
        if diffs:
            diffs.insert(
                0, "the synthetic input itself changed (tests/synthetic_traces.py?), not only the engine:"
            )
    got_tables, want_tables = result_tables(out_dir), sorted(golden["tables"])
    for name in sorted(set(want_tables) - set(got_tables)):
        diffs.append(f"{name}: not written (golden has it)")
    for name in sorted(set(got_tables) - set(want_tables)):
        diffs.append(f"{name}: written, golden has no such table")
    for name in sorted(set(got_tables) & set(want_tables)):
        got = _neutral_frame(_read(out_dir / name), prefixes)
        want = pd.read_parquet(golden_dir / name)
        diffs += compare_tables(got, want, name)
    if json_line is not None:
        got_json = _sort_doc(_neutral_json(json.loads(json_line), prefixes))
        diffs += compare_json(got_json, golden["json"], "--json")
    diffs += compare_json(manifest_results(out_dir), golden["manifest"], "manifest")
    got_events = {str(p.relative_to(out_dir)): p for p in event_tables(out_dir)}
    want_events = golden["events"]
    for rel in sorted(set(want_events) - set(got_events)):
        diffs.append(f"{rel}: not written (golden has it)")
    for rel in sorted(set(got_events) - set(want_events)):
        diffs.append(f"{rel}: written, golden has no such event table")
    for rel in sorted(set(got_events) & set(want_events)):
        got_d = table_digest(_neutral_frame(_read(got_events[rel]), prefixes))
        diffs += compare_json(got_d, want_events[rel], rel)
    return diffs


# --------------------------------------------------------------------------------------------- helpers


def golden_dir(name: str) -> Path:
    return GOLDEN / name
