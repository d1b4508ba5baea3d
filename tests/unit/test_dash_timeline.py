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
    for mask, label in (
        (gpu, lambda r: f"GPU {r.device} · stream {r.stream}"),
        (cpu, lambda r: f"CPU pid {r.pid} · thread {r.tid}"),
    ):
        sel = ev[mask.to_numpy(dtype=bool)]
        s = np.maximum(sel["start_ns"].to_numpy(), t0)
        e = np.minimum((sel["start_ns"] + sel["dur_ns"]).to_numpy(), t1)
        keys = (
            sel["device"].astype(str)
            + "/"
            + sel["stream"].astype(str)
            + "/"
            + sel["pid"].astype(str)
            + "/"
            + sel["tid"].astype(str)
        )
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
