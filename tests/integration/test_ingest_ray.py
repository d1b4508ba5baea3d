"""`mxperf ingest --ray`: a job's rank set mapped over a local Ray cluster (marker `ray`; needs the ray extra),
against the local process pool (the embedded default) and the serial ingest, and the output read back as one
dataset (pandas, pyarrow.dataset, DuckDB and polars when installed).

The rank sets are synthetic (benchmarks/make_synthetic_trace.py --ranks): the two real ranks of
tests/data/real/hta_sampled_2rank copied, time-shifted and stretched per rank, so the slowest rank of every
step is known from the sources' step times and the stretches.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from mxperf.cli import main

ROOT = Path(__file__).resolve().parents[2]
RANKS = ROOT / "tests" / "data" / "real" / "hta_sampled_2rank"
HAS_RAY = importlib.util.find_spec("ray") is not None


def _maker():
    spec = importlib.util.spec_from_file_location(
        "make_synthetic_trace", ROOT / "benchmarks" / "make_synthetic_trace.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rank_set(folder: Path, n: int) -> dict[int, int]:
    """``folder/rank-<r>.json.gz`` for r < n; returns the slowest rank of each step, from the truth: rank r
    is source ``r % 2`` with its times stretched by (1000 + s_r) / 1000."""
    mk = _maker()
    sources = [mk.Source(p) for p in mk.RANK_SOURCES]
    stretch = mk.rank_set(sources, folder, n, 50)["stretch_permille"]
    from tracing.jobs import ingest_file

    base = [ingest_file(str(p), "kineto", None, None, 0).steps.to_pandas() for p in mk.RANK_SOURCES]
    per_step = [s.groupby("step")["seconds"].sum() for s in base]
    return {
        int(step): max(range(n), key=lambda r: per_step[r % 2][step] * (1000 + stretch[r]))
        for step in per_step[0].index
    }


def _ingest(folder: Path, out: Path, capsys, *flags: str) -> dict:
    assert main(["ingest", str(folder), "-o", str(out), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _check_dataset(out: Path, n: int, slowest: dict[int, int]) -> None:
    """Per-rank tables hold every rank; the cross-rank tables name the slowest rank of each step;
    the folder reads as one dataset."""
    devices = pd.read_parquet(out / "devices.parquet")
    assert sorted(devices["rank"].unique().tolist()) == list(range(n))
    slow = pd.read_parquet(out / "stragglers.parquet")
    assert len(slow) == 2 and (slow["processes"] == n).all()
    assert dict(zip(slow["step"].tolist(), slow["slowest_rank"].tolist(), strict=True)) == slowest
    spread = pd.read_parquet(out / "rank_spread.parquet")
    assert spread["processes"].sum() == n and (spread["busy_spread_pct"] > 0).all()
    import pyarrow.dataset as ds

    events = ds.dataset(out / "events", format="parquet")
    assert events.count_rows() == sum(int(t) for t in _events_per_file(out))
    if importlib.util.find_spec("duckdb") is not None:
        import duckdb

        con = duckdb.connect()
        got = con.execute(
            f"SELECT count(DISTINCT rank) FROM read_parquet('{out}/devices.parquet')"
        ).fetchone()
        assert got == (n,)
        rows = con.execute(f"SELECT count(*) FROM read_parquet('{out}/events/*.parquet')").fetchone()[0]
        assert rows == events.count_rows()
    if importlib.util.find_spec("polars") is not None:
        import polars as pl

        assert pl.scan_parquet(out / "events" / "*.parquet").select(pl.len()).collect().item() == (
            events.count_rows()
        )
        assert pl.read_parquet(out / "stragglers.parquet")["slowest_rank"].to_list() == list(slowest.values())


def _events_per_file(out: Path) -> list[int]:
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["traces"]) == len(list((out / "events").iterdir()))
    import pyarrow.parquet as pq

    return [pq.ParquetFile(f).metadata.num_rows for f in sorted((out / "events").iterdir())]


@pytest.mark.parametrize("n", [2, 8, 37, 50, 64, 74, 256, 1000])
def test_every_rank_of_a_synthetic_set_gets_its_own_stretch(n):
    """No two ranks tie for the slowest (a 256-rank set with stretches mod 50 had five)."""
    m = _maker().stretch_modulus(n, 50)
    stretch = [(37 * r) % m for r in range(n)]
    assert len(set(stretch)) == n and max(stretch) >= min(49, n - 1)


def test_process_pool_matches_serial_and_writes_cross_rank_tables(tmp_path, capsys):
    slowest = rank_set(tmp_path / "set", 8)
    serial = _ingest(tmp_path / "set", tmp_path / "serial", capsys)
    pool = _ingest(tmp_path / "set", tmp_path / "pool", capsys, "--workers", "2")
    assert pool == serial
    _check_dataset(tmp_path / "pool", 8, slowest)
    for name in ("stragglers.parquet", "rank_spread.parquet", "devices.parquet", "steps.parquet"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / "serial" / name), pd.read_parquet(tmp_path / "pool" / name)
        )


@pytest.mark.skipif(HAS_RAY, reason="ray is installed: the missing-extra message cannot be shown")
def test_ray_flag_without_ray_says_how_to_install(tmp_path, capsys):
    assert main(["ingest", str(RANKS), "-o", str(tmp_path / "o"), "--ray", "local"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'mxperf[ray]'" in err[0]
    assert list((tmp_path / "o").rglob("*.parquet")) == []


@pytest.fixture
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.ray
@pytest.mark.skipif(not HAS_RAY, reason="needs the ray extra: pip install 'mxperf[ray]'")
def test_ray_ingest_matches_serial_ingest(tmp_path, capsys, local_ray):
    serial = _ingest(RANKS, tmp_path / "serial", capsys)
    distributed = _ingest(RANKS, tmp_path / "ray", capsys, "--ray", "local")
    assert distributed == serial
    assert sorted(p.name for p in (tmp_path / "ray" / "events").iterdir()) == [
        "rank-0.parquet",
        "rank-1.parquet",
    ]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not HAS_RAY, reason="needs the ray extra: pip install 'mxperf[ray]'")
def test_256_ranks_on_a_local_ray_cluster(tmp_path, capsys, local_ray):
    slowest = rank_set(tmp_path / "set", 256)
    distributed = _ingest(tmp_path / "set", tmp_path / "ray", capsys, "--ray", "local")
    pool = _ingest(tmp_path / "set", tmp_path / "pool", capsys, "--workers", "2")
    assert distributed == pool and len(distributed["traces"]) == 256
    _check_dataset(tmp_path / "ray", 256, slowest)
    for name in ("stragglers.parquet", "rank_spread.parquet", "devices.parquet", "ranges.parquet"):
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / "ray" / name), pd.read_parquet(tmp_path / "pool" / name)
        )
