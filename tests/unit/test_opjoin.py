"""The out-of-core GPU-op launch join (``tracing.ingest.opjoin``) gives exactly the in-memory join it replaces.

Every real Kineto trace in tests/data, every Kineto quirk and a two-process file (several launching pids: the
(correlation -> pid) fixer) go through streamed's pass 1 with tiny chunks and runs; the joined ops, merged in
(start_ns, rid) order, must equal the rows of the former ``streamed._ops`` (kept below as
:func:`_in_memory_ops`) sorted stably by start_ns. A hand-built case covers duplicate
launch keys across chunk boundaries, keys without a launch, ops without a correlation, negative keys and
start-time ties across runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import tests.synthetic_traces as st
from tracing import streamed
from tracing.analysis import metrics
from tracing.ingest import opjoin
from tracing.ingest.kineto import trace_info
from tracing.ingest.kineto_decode import KinetoDecoder
from tracing.ingest.spill import RowFile, SortedRuns
from tracing.outputs import schema

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = [
    DATA / "real" / "hta_a100_ddp_rank0_hostbound.json.gz",
    *sorted((DATA / "real" / "hta_sampled_2rank").glob("*.json.gz")),
]
QUIRKS = sorted((DATA / "quirks").glob("*/trace.json"))
_LAUNCH = ("launch_start_ns", "launch_end_ns", "launch_tid")


def _two_processes(tmp: Path) -> Path:
    """Two processes on one device in one file (as in test_ingest_streaming)."""
    return st.two_process_kineto(tmp)


def _pass1(path: Path, spill: Path, chunk: int) -> tuple[streamed._Pass1, int, list[str]]:
    """streamed._stream's pass 1 over a Kineto file (``chunk`` rows at a time): (pass 1, base_ns, names)."""
    p1 = streamed._Pass1(spill, spill)
    dec = KinetoDecoder(path, include_python=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(streamed, "CHUNK_ROWS", chunk)
        names = streamed.read_pass1(dec, p1)
    base_ns, _, _ = trace_info(Path(path), dec.reader.meta, None, dec.skipped)
    return p1, base_ns, names


def _merged(out: opjoin.Joined, chunk_rows: int) -> dict[str, np.ndarray]:
    runs = out.runs
    chunks = list(runs.merged(chunk_rows))
    assert all(0 < len(ch["rid"]) <= max(chunk_rows, 1024 * len(runs._runs)) for ch in chunks)
    return {
        c: np.concatenate([np.zeros(0, np.int64)] + [ch[c] for ch in chunks]) for c in opjoin.JOINED_COLUMNS
    }


def _in_memory_ops(
    parts: list[dict[str, np.ndarray]],
    launches: SortedRuns,
    base_ns: int,
    fix: Callable[[dict[str, np.ndarray]], None],
    chunk_rows: int,
) -> dict[str, np.ndarray]:
    """The former ``streamed._ops`` join (every op in memory, rid order), without its frame."""
    cols = {c: np.concatenate([np.zeros(0, np.int64)] + [p[c] for p in parts]) for c in streamed.OP_COLUMNS}
    cols["start_ns"] += np.int64(base_ns)
    fix(cols)
    n_ops = len(cols["kind"])
    key = metrics.launch_key(cols["pid"], cols["correlation"]).view(np.int64)
    has_corr = np.flatnonzero(cols["correlation"] >= 0)
    order = has_corr[np.argsort(key[has_corr], kind="stable")]
    keys = key[order]
    l_start = np.full(n_ops, schema.NO_ID, np.int64)
    l_end, l_tid = l_start.copy(), l_start.copy()
    last = None
    for chunk in launches.merged(chunk_rows):
        k = chunk["key"]
        first = np.r_[True, k[1:] != k[:-1]]
        if last is not None:
            first[0] = k[0] != last
        last = k[-1]
        u = np.flatnonzero(first)
        lo, hi = np.searchsorted(keys, k[u], side="left"), np.searchsorted(keys, k[u], side="right")
        hit = hi > lo
        u, lo, hi = u[hit], lo[hit], hi[hit]
        if len(u) == 0:
            continue
        n = hi - lo
        rows = order[np.repeat(lo, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))]
        src = np.repeat(u, n)
        start = chunk["start"][src] + np.int64(base_ns)
        l_start[rows] = start
        l_end[rows] = start + chunk["dur"][src]
        l_tid[rows] = chunk["tid"][src]
    cols.update(launch_start_ns=l_start, launch_end_ns=l_end, launch_tid=l_tid)
    return cols


def _assert_equals_in_memory(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """``got`` (merged joined ops) equals ``want`` (rid order) sorted stably by start_ns."""
    assert np.all(np.diff(want["rid"]) > 0)  # rid order: a stable sort by start gives (start_ns, rid) order
    order = np.argsort(want["start_ns"], kind="stable")
    assert len(got["rid"]) == len(order)
    for c in opjoin.JOINED_COLUMNS:
        assert np.array_equal(got[c], want[c][order]), c


def _op_parts(p1: streamed._Pass1) -> list[dict[str, np.ndarray]]:
    """Pass 1's GPU op rows (a RowFile, or formerly a list of parts), copied."""
    if isinstance(p1.ops, RowFile):
        return list(p1.ops.blocks())
    return [{c: part[c].copy() for c in streamed.OP_COLUMNS} for part in p1.ops]


@pytest.mark.parametrize("path", [*REAL, *QUIRKS, "two-processes"], ids=lambda p: str(p).split("data/")[-1])
@pytest.mark.parametrize(("run_rows", "chunk_rows"), [(97, 61), (1 << 22, 1 << 22)])
def test_joined_ops_equal_streamed_ops(path, run_rows, chunk_rows, tmp_path, monkeypatch):
    if path == "two-processes":
        path = _two_processes(tmp_path)
    monkeypatch.setattr(streamed, "RUN_ROWS", 1511)  # the launches: several runs on disk
    monkeypatch.setattr(streamed, "CHUNK_ROWS", 997)
    spill = tmp_path / "spill"
    spill.mkdir()
    p1, base_ns, _ = _pass1(path, spill, 997)
    try:
        fix = streamed._gpu_pid_fixer(p1)
        parts = _op_parts(p1)
        ops = RowFile(tmp_path / "ops.bin", streamed.OP_COLUMNS)
        for part in parts:
            ops.add(part)
        work = tmp_path / "join"
        work.mkdir()
        out = opjoin.joined_ops(ops, p1.launches, base_ns, fix, work, run_rows, chunk_rows)
        try:
            got = _merged(out, chunk_rows)
        finally:
            out.close()
        assert not list(work.iterdir())
        want = _in_memory_ops(parts, p1.launches, base_ns, fix, 997)
    finally:
        p1.close()
    assert len(got["rid"]) == ops.rows
    _assert_equals_in_memory(got, want)
    launched = got["launch_start_ns"] != schema.NO_ID
    lag = (got["start_ns"] - got["launch_start_ns"])[launched]
    assert out.max_lag == (int(lag.max()) if len(lag) else None)
    if "two" in str(path):
        assert len(p1.launch_pids) == 2 and len(np.unique(got["pid"])) == 2
    if path == REAL[0]:  # many runs and chunks, most ops matched
        assert len(got["rid"]) > 20 * run_rows or run_rows == 1 << 22
        assert (got["launch_tid"] != schema.NO_ID).mean() > 0.5


# hand-built: pids whose keys are negative int64 (bit 63 set) and positive ones
_PIDS = np.array([7, (1 << 31) + 5, (1 << 32) - 1], np.int64)


def _fix(block: dict[str, np.ndarray]) -> None:
    """The launching pid of each GPU row from its correlation (host rows keep theirs)."""
    gpu = block["device"] >= 0
    block["pid"][gpu] = _PIDS[np.abs(block["correlation"][gpu]) % len(_PIDS)]


def _hand_built(tmp: Path, launch_run_rows: int) -> tuple[RowFile, SortedRuns, list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(11)
    n_ops, n_launch = 400, 300
    ops = {
        "rid": np.arange(0, 2 * n_ops, 2, dtype=np.int64),
        "kind": rng.integers(0, len(schema.EVENT_KINDS), n_ops),
        "name": rng.integers(0, 9, n_ops),
        "pid": np.full(n_ops, 3, np.int64),
        "device": rng.integers(-1, 2, n_ops),
        "stream": rng.integers(0, 4, n_ops),
        "start_ns": rng.integers(0, 25, n_ops),  # many start ties, spread over runs
        "dur_ns": rng.integers(1, 100, n_ops),
        "correlation": rng.integers(-1, 60, n_ops),  # -1: none; >= 45: no launch of that key
    }
    corr = np.concatenate([np.full(9, 5), np.full(7, 6), rng.integers(0, 45, n_launch - 16)])  # duplicates
    pid = _PIDS[corr % len(_PIDS)]
    pid[:4] = 3  # launches of host pid 3 (device -1 ops keep it)
    pid[9:11] = 3
    launches = {
        "key": metrics.launch_key(pid, corr).view(np.int64),
        "rid": np.arange(1, 2 * n_launch, 2, dtype=np.int64),
        "tid": rng.integers(1, 5, n_launch),
        "start": rng.integers(0, 10**6, n_launch),
        "dur": rng.integers(1, 1000, n_launch),
        "corr": corr,
        "pid": pid,
    }
    assert (launches["key"] < 0).any() and (launches["key"] > 0).any()
    rf = RowFile(tmp / "ops.bin", streamed.OP_COLUMNS)
    parts = []
    for a in range(0, n_ops, 37):
        part = {c: v[a : a + 37].copy() for c, v in ops.items()}
        rf.add(part)
        parts.append({c: v.copy() for c, v in part.items()})
    ldir = tmp / "launches"
    ldir.mkdir()
    lr = SortedRuns(ldir, streamed.LAUNCH_COLUMNS, ("key", "rid"), launch_run_rows)
    for a in range(0, n_launch, 23):
        lr.add({c: v[a : a + 23] for c, v in launches.items()})
    return rf, lr, parts


def _reference(parts: list[dict[str, np.ndarray]], lr: SortedRuns, base_ns: int) -> dict[str, np.ndarray]:
    """The join row by row: each op's first (lowest rid) launch of its key, in (start_ns, rid) order."""
    cols = {c: np.concatenate([p[c] for p in parts]) for c in streamed.OP_COLUMNS}
    cols["start_ns"] = cols["start_ns"] + base_ns
    _fix(cols)
    launch = {c: np.concatenate([ch[c] for ch in lr.merged(10**6)]) for c in streamed.LAUNCH_COLUMNS}
    first: dict[int, tuple[int, int, int, int]] = {}
    for k, r, s, d, t in zip(
        *(launch[c].tolist() for c in ("key", "rid", "start", "dur", "tid")), strict=True
    ):
        if k not in first or r < first[k][0]:
            first[k] = (r, s, d, t)
    rows = []
    for i in range(len(cols["rid"])):
        ls = le = lt = schema.NO_ID
        if cols["correlation"][i] >= 0:
            k = int(
                metrics.launch_key(cols["pid"][i : i + 1], cols["correlation"][i : i + 1]).view(np.int64)[0]
            )
            if k in first:
                _, s, d, lt = first[k]
                ls, le = s + base_ns, s + base_ns + d
        rows.append((*(int(cols[c][i]) for c in opjoin.JOINED_COLUMNS[:9]), ls, le, lt))
    rows.sort(key=lambda row: (row[0], row[1]))
    return {c: np.array([row[j] for row in rows], np.int64) for j, c in enumerate(opjoin.JOINED_COLUMNS)}


@pytest.mark.parametrize(
    ("launch_run_rows", "run_rows", "chunk_rows"),
    [(10**6, 3, 2), (10**6, 5, 1), (10**6, 10**6, 3), (41, 7, 5), (41, 10**6, 10**6), (10**6, 50, 17)],
)
def test_hand_built_join(launch_run_rows, run_rows, chunk_rows, tmp_path, monkeypatch):
    base_ns = 1_700_000_000_000_000_000
    rf, lr, parts = _hand_built(tmp_path, launch_run_rows)
    want = _reference(parts, lr, base_ns)
    assert (want["correlation"] < 0).any()  # the cases are there
    assert ((want["correlation"] >= 0) & (want["launch_tid"] == schema.NO_ID)).any()
    assert (want["launch_tid"] != schema.NO_ID).any()

    biggest = [0]

    class Recording(SortedRuns):
        def add(self, cols: dict[str, np.ndarray]) -> None:
            biggest[0] = max(biggest[0], len(cols["rid"]))
            super().add(cols)

    monkeypatch.setattr(opjoin, "SortedRuns", Recording)
    work = tmp_path / "join"
    work.mkdir()
    out = opjoin.joined_ops(rf, lr, base_ns, _fix, work, run_rows, chunk_rows)
    if run_rows >= 400 and launch_run_rows >= 300:  # no runs on disk: merged() gives chunk_rows at a time
        assert 0 < biggest[0] <= chunk_rows  # rows are added a chunk at a time, never all at once
    assert out.runs.columns == opjoin.JOINED_COLUMNS
    # only the returned runs' files are left (the key-ordered runs are gone), and close() removes them
    assert sorted(p.name for p in work.iterdir()) == sorted(p.name for p, _ in out.runs._runs)
    if run_rows < 400:
        assert len(out.runs._runs) > 1
    got = _merged(out, chunk_rows)
    got_again = _merged(out, 10**6)
    out.close()
    assert not list(work.iterdir())
    for c in opjoin.JOINED_COLUMNS:
        assert np.array_equal(got[c], want[c]), c
        assert np.array_equal(got_again[c], want[c]), c
    launched = want["launch_start_ns"] != schema.NO_ID
    assert out.max_lag == int((want["start_ns"] - want["launch_start_ns"])[launched].max())
    # and the former in-memory join agrees
    _assert_equals_in_memory(got, _in_memory_ops(parts, lr, base_ns, _fix, 3))
    lr.close()


def test_no_ops_and_no_launches(tmp_path):
    rf = RowFile(tmp_path / "ops.bin", streamed.OP_COLUMNS)
    lr = SortedRuns(tmp_path, streamed.LAUNCH_COLUMNS, ("key", "rid"), 10)
    out = opjoin.joined_ops(rf, lr, 5, lambda b: None, tmp_path, 10, 10)
    assert list(out.merged(10)) == [] and out.rows == 0 and out.max_lag is None
    out.close()
    rf = RowFile(tmp_path / "ops2.bin", streamed.OP_COLUMNS)  # ops, but no launch at all
    rf.add({c: np.array([1, 2], np.int64) for c in streamed.OP_COLUMNS})
    out = opjoin.joined_ops(rf, lr, 5, lambda b: None, tmp_path, 10, 10)
    got = _merged(out, 10)
    out.close()
    assert got["start_ns"].tolist() == [6, 7] and got["launch_tid"].tolist() == [schema.NO_ID] * 2
    assert out.max_lag is None  # nothing launched: nothing bounds the lag
