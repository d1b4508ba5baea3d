"""The Timeline page's server-side downsampler and its Perfetto download (issue #35 item 4)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dashboards import perfetto, timeline, timeline_boxes
from tracing.outputs import schema, store

REPO = Path(__file__).resolve().parents[2]
A100 = REPO / "examples" / "runs" / "ingest-a100-hostbound"
EVENTS = A100 / "events" / "rank-0.parquet"


def _direct(path: Path, t0: int, t1: int) -> dict[str, int]:
    """The union of each track's ops clipped to [t0, t1), straight from the Parquet (no islands)."""
    ev = pd.read_parquet(path)
    kind = ev["kind"].astype(str)
    gpu = kind.isin(timeline_boxes.GPU_KINDS) & (ev["device"] >= 0)
    cpu = kind.isin(timeline_boxes.CPU_KINDS) & (ev["device"] < 0)
    out = {}
    for mask, label, label_keys in (
        (
            gpu,
            lambda r: f"GPU {r.device} · stream {r.stream}",
            lambda d: d["device"].astype(str) + "/" + d["stream"].astype(str),
        ),
        (
            cpu,
            lambda r: f"CPU pid {r.pid} · thread {r.tid}",
            lambda d: d["pid"].astype(str) + "/" + d["tid"].astype(str),
        ),
    ):
        sel = ev[mask.to_numpy(dtype=bool)]
        s = np.maximum(sel["start_ns"].to_numpy(), t0)
        e = np.minimum((sel["start_ns"] + sel["dur_ns"]).to_numpy(), t1)
        # a GPU stream's ops may come from several processes: a track is (device, stream) or (pid, tid)
        keys = label_keys(sel)
        for _, idx in sel.groupby(keys.to_numpy()).indices.items():
            r = sel.iloc[idx[0]]
            u = timeline_boxes.union_ns(s[idx], e[idx])
            if u:
                out[label(r)] = u
    return out


@pytest.mark.parametrize("k", [2, 7, 50, 600])
@pytest.mark.parametrize("frac", [(0.0, 1.0), (0.3, 0.31), (0.5, 0.75), (0.05, 0.0501)])
def test_boxes_conserve_busy_time_and_stay_under_k(k: int, frac: tuple[float, float]) -> None:
    tl = timeline_boxes.build(EVENTS)
    span = tl.last_ns - tl.first_ns
    t0, t1 = tl.first_ns + int(frac[0] * span), tl.first_ns + int(frac[1] * span)
    boxes = timeline_boxes.boxes(tl, t0, t1, k)
    got = boxes.groupby("track")["busy_ns"].sum().to_dict()
    assert got == _direct(EVENTS, t0, t1)  # exact, in ns, per track
    assert boxes.groupby("track").size().max() <= k
    assert (boxes["start_ns"] >= t0).all() and (boxes["end_ns"] <= t1).all()
    assert (boxes["busy_ns"] <= boxes["end_ns"] - boxes["start_ns"]).all()
    for _, grp in boxes.groupby("track"):  # boxes of a track never overlap
        assert (grp["start_ns"].to_numpy()[1:] >= grp["end_ns"].to_numpy()[:-1]).all()


def test_both_kinds_of_track_and_kernel_names() -> None:
    tl = timeline_boxes.build(EVENTS)
    assert tl.tracks["gpu"].any() and (~tl.tracks["gpu"]).any()
    ev = pd.read_parquet(EVENTS)
    kernels = ev[ev["kind"].astype(str) == "kernel"]
    t0 = int(kernels["start_ns"].iloc[len(kernels) // 2]) - 1_000
    boxes = timeline_boxes.boxes(tl, t0, t0 + 200_000, 600)  # 0.2 ms: single kernels
    single = boxes[(boxes["count"] == 1) & boxes["track"].str.startswith("GPU")]
    assert len(single) and single["kind"].isin(["kernel", "memcpy", "memset"]).all()
    names = set(ev.loc[ev["kind"].astype(str) == "kernel", "name"].astype(str))
    assert set(single.loc[single["kind"] == "kernel", "name"]) <= names


def test_host_stall_spans_are_the_ingests_numbers() -> None:
    stalls = timeline_boxes.host_stalls(EVENTS)
    dev = store.read_table(A100 / store.DEVICES)
    tl = timeline_boxes.build(EVENTS)
    boxes = timeline_boxes.stall_boxes(stalls, tl.first_ns - 1, tl.last_ns + 1, 5)
    assert len(boxes) <= 5
    assert int(boxes["busy_ns"].sum()) == int(dev["host_stall_ns"].sum())


def _synthetic_events(path: Path, n: int) -> None:
    """``n`` events in the events schema: 8 CPU threads and 4 GPU streams, random nested / queued ops."""
    rng = np.random.default_rng(35)
    gpu = rng.random(n) < 0.4
    start = np.sort(rng.integers(0, 60_000_000_000, n))  # one minute
    dur = rng.integers(1_000, 80_000, n)
    kind = np.where(gpu, "kernel", np.where(rng.random(n) < 0.5, "cpu_op", "runtime"))
    names = np.array([f"op_{i}" for i in range(64)], dtype=object)
    cols = {
        "kind": pa.array(kind).dictionary_encode(),
        "name": pa.array(names[rng.integers(0, 64, n)]).dictionary_encode(),
        "domain": pa.array(np.full(n, "", object)).dictionary_encode(),
        "pid": pa.array(np.full(n, 100, np.int64)),
        "tid": pa.array(np.where(gpu, -1, rng.integers(0, 8, n))),
        "device": pa.array(np.where(gpu, rng.integers(0, 2, n), -1)),
        "stream": pa.array(np.where(gpu, 7 + rng.integers(0, 2, n), -1)),
        "start_ns": pa.array(start),
        "dur_ns": pa.array(dur),
    }
    for c in ("correlation", "external_id", "bytes", "end_tid"):
        cols[c] = pa.array(np.full(n, -1, np.int64))
    cols["shapes"] = pa.array(np.full(n, "", object)).dictionary_encode()
    assert list(cols) == list(schema.EVENT_COLUMNS)
    pq.write_table(pa.table(cols), path, row_group_size=1 << 20)


def test_rows_sent_are_bounded_for_a_large_events_table(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.parquet"
    _synthetic_events(path, 2_000_000)
    tl = timeline_boxes.build(path)
    assert tl.ops == 2_000_000 and len(tl.tracks) == 12
    k = timeline_boxes.DEFAULT_K
    for t0, t1 in ((tl.first_ns, tl.last_ns), (tl.first_ns + 10**10, tl.first_ns + 10**10 + 10**7)):
        boxes = timeline_boxes.boxes(tl, t0, t1, k)
        assert len(boxes) <= k * len(tl.tracks)
        assert boxes.groupby("track").size().max() <= k
    # a 50 µs window: every op its own box, conservation still exact
    t0 = tl.first_ns + 3 * 10**10
    boxes = timeline_boxes.boxes(tl, t0, t0 + 50_000, k)
    assert boxes.groupby("track")["busy_ns"].sum().to_dict() == _direct(path, t0, t0 + 50_000)


def test_bands_steps_phases_and_microbatches() -> None:
    ranges = store.read_table(A100 / store.RANGES)
    b = timeline.bands(ranges, None, int(ranges["start_ns"].min()), int(ranges["end_ns"].max()))
    assert set(b["band"]) == {"steps", "phases"}
    assert {"## forward ##", "## backward ##", "## optimizer ##"} <= set(b["label"])
    verl = REPO / "examples" / "runs" / "ingest-verl-sim-bf16"
    mb = store.read_table(verl / store.MICROBATCHES)
    vr = store.read_table(verl / store.RANGES)
    b = timeline.bands(vr, mb, int(mb["start_ns"].min()), int(mb["end_ns"].max()))
    assert "micro-batches" in set(b["band"]) and "phases" in set(b["band"])


def test_perfetto_download_is_a_gzip_kineto_trace_that_ingests_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(perfetto.CACHE_ENV, str(tmp_path / "cache"))
    out = perfetto.annotated_trace(EVENTS, "ingest-a100-hostbound/events/rank-0.parquet")
    assert perfetto.annotated_trace(EVENTS) == out  # cached
    doc = json.loads(gzip.decompress(out.read_bytes()))
    cats = {e.get("cat") for e in doc["traceEvents"]}
    assert {"kernel", "cuda_runtime", "cpu_op", "user_annotation", "mxperf"} <= cats
    tracks = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert {"GPU busy", "host stall", "idle (other)"} <= tracks
    dst = tmp_path / "re"
    subprocess.run(
        [sys.executable, "-m", "mxperf.cli", "ingest", str(out), "-o", str(dst)],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    got = store.read_table(dst / store.DEVICES)
    want = store.read_table(A100 / store.DEVICES)
    for col in ("span_ns", "busy_ns", "host_stall_ns", "num_kernels"):
        assert got[col].tolist() == want[col].tolist(), col


# --- the fast path (one pyarrow pass, numpy islands, host stalls, disk cache) against direct computations ---

EXAMPLE_EVENTS = sorted((REPO / "examples" / "runs").glob("*/events/rank-*.parquet"))


def _reference_islands(path: Path) -> tuple[pd.DataFrame, list[tuple]]:
    """Tracks (label, ops incl. zero-length, min pid / tid / device / stream) and each track's islands merged
    one op at a time in Python: (label, start, end, ops, longest, name and kind of the first longest op in
    (start, row) order)."""
    ev = pd.read_parquet(path)
    kind = ev["kind"].astype(str)
    gpu = (kind.isin(timeline_boxes.GPU_KINDS) & (ev["device"] >= 0)).to_numpy(dtype=bool)
    cpu = (kind.isin(timeline_boxes.CPU_KINDS) & (ev["device"] < 0)).to_numpy(dtype=bool)
    sel = ev[gpu | cpu].assign(gpu=gpu[gpu | cpu], row=np.flatnonzero(gpu | cpu))
    sel = sel.assign(
        a=np.where(sel["gpu"], sel["device"], sel["pid"]), b=np.where(sel["gpu"], sel["stream"], sel["tid"])
    )
    tracks, islands = [], []
    for (g, _a, _b), grp in sel.groupby(["gpu", "a", "b"], sort=False):
        mins = {c: int(grp[c].min()) for c in ("pid", "tid", "device", "stream")}
        label = (
            f"GPU {mins['device']} · stream {mins['stream']}"
            if g
            else f"CPU pid {mins['pid']} · thread {mins['tid']}"
        )
        tracks.append({"track": label, "gpu": bool(g), **mins, "ops": len(grp)})
        ops = sorted(
            (int(s), int(s + d), int(r), str(n), str(k))
            for s, d, r, n, k in zip(
                grp["start_ns"], grp["dur_ns"], grp["row"], grp["name"], grp["kind"], strict=True
            )
            if d > 0
        )
        cur: list | None = None
        for s, e, _r, n, k in ops:
            if cur is None or s > cur[2]:
                if cur is not None:
                    islands.append(tuple(cur))
                cur = [label, s, e, 1, e - s, n, k]
            else:
                cur[2], cur[3] = max(cur[2], e), cur[3] + 1
                if e - s > cur[4]:
                    cur[4:] = [e - s, n, k]
        if cur is not None:
            islands.append(tuple(cur))
    return pd.DataFrame(tracks), islands


def _islands_of(tl: timeline_boxes.Timeline) -> list[tuple]:
    isl, labels = tl.islands, tl.tracks["track"].tolist()
    names = tl.names.cast(pa.string()).to_pylist()
    kinds = tl.kinds.cast(pa.string()).to_pylist()
    return [
        (labels[t], s, e, n, lg, nm, kd)
        for t, s, e, n, lg, nm, kd in zip(
            isl.track.tolist(),
            isl.start.tolist(),
            isl.end.tolist(),
            isl.n.tolist(),
            isl.longest.tolist(),
            names,
            kinds,
            strict=True,
        )
    ]


def _device_stall_ns(path: Path) -> dict[str, int]:
    """Per host-stall track label, the device's ``host_stall_ns`` as ``devices.parquet`` has it (the engine's
    ``DEVICES_SQL``, a sum over gaps, not the span list the page draws)."""
    from tracing.analysis import gpu_tables
    from tracing.ingest import engine

    with engine.session() as con:
        engine.parquet_events(con, path)
        rows = engine.arrow(con, gpu_tables.DEVICES_SQL).to_pylist() if gpu_tables.make_ops(con) else []
    several = len({r["pid"] for r in rows}) > 1
    return {
        f"GPU {r['device']} · host stall" + (f" (pid {r['pid']})" if several else ""): r["host_stall_ns"]
        for r in rows
    }


def _assert_stalls_are_the_devices(stalls: timeline_boxes.Stalls, path: Path) -> None:
    want = _device_stall_ns(path)
    assert stalls.labels == list(want)
    isl = stalls.islands
    got = np.bincount(isl.track, weights=isl.end - isl.start, minlength=len(want)).astype(np.int64)
    assert dict(zip(stalls.labels, got.tolist(), strict=True)) == want


def _random_events(path: Path, n: int, seed: int) -> None:
    """``n`` events with what the fast path must get right: 2 processes, GPU ops on 2 devices / 3 streams
    (some of device -1), zero-length ops, equal starts, nested CPU ops, launches (some duplicated, some
    missing) joined by correlation, 5 row groups."""
    rng = np.random.default_rng(seed)
    kinds = np.array(["kernel", "memcpy", "memset", "runtime", "driver", "cpu_op", "python", "range", "sync"])
    kind = kinds[rng.choice(len(kinds), n, p=[0.2, 0.05, 0.05, 0.25, 0.05, 0.2, 0.1, 0.05, 0.05])]
    gpu = np.isin(kind, ["kernel", "memcpy", "memset", "sync"])
    start = rng.integers(0, 2_000_000, n) // 50 * 50  # many equal starts
    dur = np.where(rng.random(n) < 0.05, 0, rng.integers(1, 60_000, n))
    pid = rng.choice([100, 200], n)
    corr = rng.integers(0, n // 3, n)
    corr[rng.random(n) < 0.1] = -1
    device = np.where(gpu, np.where(rng.random(n) < 0.03, -1, rng.integers(0, 2, n)), -1)
    cols = {
        "kind": pa.array(kind).dictionary_encode(),
        "name": pa.array(
            np.array([f"op_{i}" for i in range(40)], object)[rng.integers(0, 40, n)]
        ).dictionary_encode(),
        "domain": pa.array(np.full(n, "", object)).dictionary_encode(),
        "pid": pa.array(pid),
        "tid": pa.array(np.where(gpu, -1, pid * 10 + rng.integers(0, 3, n))),
        "device": pa.array(device),
        "stream": pa.array(np.where(device >= 0, rng.choice([7, 13, 20], n), -1)),
        "start_ns": pa.array(start),
        "dur_ns": pa.array(dur),
        "correlation": pa.array(corr),
    }
    for c in ("external_id", "bytes", "end_tid"):
        cols[c] = pa.array(np.full(n, -1, np.int64))
    cols["shapes"] = pa.array(np.full(n, "", object)).dictionary_encode()
    assert list(cols) == list(schema.EVENT_COLUMNS)
    pq.write_table(pa.table(cols), path, row_group_size=n // 5 + 1)


def _assert_fast_path_is_direct(path: Path) -> None:
    tl, stalls = timeline_boxes.compute(path)
    tracks, islands = _reference_islands(path)
    got = tl.tracks.sort_values("track").reset_index(drop=True)
    want = tracks.sort_values("track").reset_index(drop=True)[got.columns]
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert list(tl.tracks["gpu"]) == sorted(tl.tracks["gpu"])  # CPU threads first
    assert sorted(_islands_of(tl)) == sorted(islands)
    _assert_stalls_are_the_devices(stalls, path)
    for t0, t1 in ((tl.first_ns, tl.last_ns), (tl.first_ns + (tl.last_ns - tl.first_ns) // 3, tl.last_ns)):
        boxes = timeline_boxes.boxes(tl, t0, t1, 50)
        assert boxes.groupby("track")["busy_ns"].sum().to_dict() == _direct(path, t0, t1)


@pytest.mark.parametrize("path", EXAMPLE_EVENTS, ids=lambda p: p.parent.parent.name)
def test_fast_path_equals_direct_computation_on_the_examples(path: Path) -> None:
    _assert_fast_path_is_direct(path)


@pytest.mark.parametrize("seed", [1, 2])
def test_fast_path_equals_direct_computation_on_random_events(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "rank-0.parquet"
    _random_events(path, 30_000, seed)
    _assert_fast_path_is_direct(path)
    stalls = timeline_boxes.host_stalls(path)
    # 2 pids x devices -1, 0, 1 (the engine keeps a GPU op without a device as device -1), some stalls
    assert len(stalls.labels) == 6 and len(stalls.islands.start)


def test_host_stalls_of_the_a100_trace_add_up_to_its_device_row(tmp_path: Path) -> None:
    stalls = timeline_boxes.host_stalls(EVENTS)
    assert stalls.labels == ["GPU 0 · host stall"] and len(stalls.islands.start) > 100
    _assert_stalls_are_the_devices(stalls, EVENTS)


def _same(a: tuple, b: tuple) -> None:
    (ta, sa), (tb_, sb) = a, b
    pd.testing.assert_frame_equal(ta.tracks, tb_.tracks)
    assert _islands_of(ta) == _islands_of(tb_)
    assert (ta.first_ns, ta.last_ns) == (tb_.first_ns, tb_.last_ns)
    assert sa.labels == sb.labels
    for c in ("track", "start", "end", "n", "longest", "row"):
        assert np.array_equal(getattr(sa.islands, c), getattr(sb.islands, c)), c
    pd.testing.assert_frame_equal(
        timeline_boxes.boxes(ta, ta.first_ns, ta.last_ns),
        timeline_boxes.boxes(tb_, tb_.first_ns, tb_.last_ns),
    )


def test_cache_reads_back_the_same_and_follows_a_rewritten_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(timeline_boxes.CACHE_ENV, str(tmp_path / "cache"))
    path = tmp_path / "events" / "rank-0.parquet"
    path.parent.mkdir()
    _random_events(path, 20_000, 3)
    first = timeline_boxes.load(path)
    entry = timeline_boxes.cache_entry(path)
    assert entry.is_dir() and entry.parent == tmp_path / "cache" / "timeline"
    _same(first, timeline_boxes.compute(path))
    # read back: no events read (an events file the cache does not need could be anything)
    monkeypatch.setattr(timeline_boxes, "compute", lambda p: pytest.fail("recomputed"))
    _same(timeline_boxes.load(path), first)
    monkeypatch.undo()
    monkeypatch.setenv(timeline_boxes.CACHE_ENV, str(tmp_path / "cache"))
    # rewrite the file with other data: a new entry, the old one gone, the new numbers
    _random_events(path, 12_000, 4)
    again = timeline_boxes.load(path)
    assert timeline_boxes.cache_entry(path) != entry and not entry.exists()
    assert again[0].ops != first[0].ops
    _same(again, timeline_boxes.compute(path))
    assert [p.name for p in (tmp_path / "cache" / "timeline").iterdir()] == [
        timeline_boxes.cache_entry(path).name
    ]


def test_a_broken_or_unwritable_cache_falls_back_to_the_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(timeline_boxes.CACHE_ENV, str(tmp_path / "cache"))
    first = timeline_boxes.load(EVENTS)
    (timeline_boxes.cache_entry(EVENTS) / "islands.arrow").write_bytes(b"not arrow")
    _same(timeline_boxes.load(EVENTS), first)
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(timeline_boxes.CACHE_ENV, str(blocker))  # cache root under a file: cannot be made
    _same(timeline_boxes.load(EVENTS), first)
