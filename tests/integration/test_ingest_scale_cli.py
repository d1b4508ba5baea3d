"""`mxperf ingest` flags for large traces and many ranks: --stream, --progress, --workers on one file, and the
cross-rank tables of a rank set; --json stays the last stdout line whatever stderr shows."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from mxperf.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "real"
A100 = DATA / "hta_a100_ddp_rank0_hostbound.json.gz"
RANKS = DATA / "hta_sampled_2rank"
TABLES = ("devices", "streams", "ranges", "kernels", "steps")


def _run(capsys, *args: str) -> tuple[dict, str]:
    assert main(["ingest", *args, "--json"]) == 0
    out, err = capsys.readouterr()
    return json.loads(out.strip().splitlines()[-1]), err


def test_streamed_and_parallel_ingest_write_the_in_memory_tables(tmp_path, capsys):
    ref, _ = _run(capsys, str(A100), "-o", str(tmp_path / "mem"), "--stream", "off")
    cases = (
        ("stream", ["--stream", "on"]),
        ("two", ["--workers", "2"]),
        ("sharded", ["--stream", "on", "--workers", "2"]),
    )
    for name, flags in cases:
        got, _ = _run(capsys, str(A100), "-o", str(tmp_path / name), *flags)
        assert got == ref
        for t in TABLES:
            pd.testing.assert_frame_equal(
                pd.read_parquet(tmp_path / "mem" / f"{t}.parquet"),
                pd.read_parquet(tmp_path / name / f"{t}.parquet"),
            )
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / "mem" / "events"), pd.read_parquet(tmp_path / name / "events")
        )
        assert not list((tmp_path / name).glob(".staging*")), "spill and staging files are gone"


def test_progress_goes_to_stderr_and_json_stays_last_on_stdout(tmp_path, capsys):
    quiet, err_quiet = _run(capsys, str(RANKS), "-o", str(tmp_path / "quiet"), "--no-progress")
    loud, err = _run(capsys, str(RANKS), "-o", str(tmp_path / "loud"), "--progress", "--stream", "on")
    assert loud == quiet
    assert "ingest: 2/2 files" in err and "ingest: " not in err_quiet
    assert "\r" in err  # one line redrawn in place


def test_a_rank_set_gets_cross_rank_tables(tmp_path, capsys):
    _run(capsys, str(RANKS), "-o", str(tmp_path / "o"))
    slow = pd.read_parquet(tmp_path / "o" / "stragglers.parquet")
    steps = pd.read_parquet(tmp_path / "o" / "steps.parquet")
    per_rank = steps.groupby(["step", "rank"])["seconds"].sum().unstack()
    assert slow["step"].tolist() == sorted(per_rank.index.tolist())
    assert slow["slowest_rank"].tolist() == per_rank.idxmax(axis=1).tolist()
    assert (slow["job_seconds"] == slow["slowest_seconds"]).all()
    assert (slow["slowest_seconds"] >= slow["median_seconds"]).all()
    spread = pd.read_parquet(tmp_path / "o" / "rank_spread.parquet")
    devices = pd.read_parquet(tmp_path / "o" / "devices.parquet")
    for row in spread.itertuples():
        mine = devices[devices["device"] == row.device]
        assert row.busy_max_ns == mine["busy_ns"].max() and row.busy_min_ns == mine["busy_ns"].min()


def test_one_rank_has_no_cross_rank_tables(tmp_path, capsys):
    _run(capsys, str(A100), "-o", str(tmp_path / "o"))
    assert not (tmp_path / "o" / "stragglers.parquet").exists()
    assert not (tmp_path / "o" / "rank_spread.parquet").exists()
