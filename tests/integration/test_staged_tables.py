"""The range, kernel and stream tables leave each worker as staged Parquet: the command writes the same tables as
the concatenation of every file's tables, and the driver holds summaries only."""

from __future__ import annotations

import pickle
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
import synthetic_traces as st

from mxperf.cli import main
from tracing import staged
from tracing.jobs import ingest_file, ingest_many
from tracing.outputs import schema, store
from tracing.staged import STAGED, phase_seconds, stage_tables

DATA = Path(__file__).resolve().parents[1] / "data"
FILES = [
    DATA / "real" / "hta_sampled_2rank" / "rank-0.json.gz",
    DATA / "real" / "hta_sampled_2rank" / "rank-1.json.gz",
    DATA / "real" / "hta_a100_ddp_rank0_hostbound.json.gz",
    DATA / "real" / "nsysai_h100x2_mfu_before.sqlite",
]


@pytest.mark.parametrize(("workers", "stage_rows"), [(1, 50), (2, 50), (2, staged.STAGE_ROWS)])
def test_the_command_writes_the_concatenation_of_every_files_tables(
    workers, stage_rows, tmp_path, capsys, monkeypatch
):
    """Tables of ``stage_rows`` rows or more are staged by the workers (forked pool workers see the patched
    threshold), the others gathered: written part by part, the same table as all files' concatenated."""
    monkeypatch.setattr(staged, "STAGE_ROWS", stage_rows)
    items = [(p, "nsys" if p.suffix == ".sqlite" else "kineto") for p in FILES]
    held = ingest_many(items, None)  # no staging folder: nothing staged, every table held
    assert all(not r.staged_tables and r.num_ranges is None for r in held)
    if stage_rows < 100:  # some tables staged (by the pool's workers too), some held, in one output table
        assert {len(r.ranges) >= stage_rows for r in held} == {True, False}
        (tmp_path / "stage").mkdir()
        got = ingest_many(items, str(tmp_path / "stage"), workers=workers)
        assert ["ranges" in r.staged_tables for r in got] == [len(r.ranges) >= stage_rows for r in held]
        assert [r.num_ranges for r in got] == [len(r.ranges) for r in held]
    out = tmp_path / "out"
    assert main(["ingest", *map(str, FILES), "-o", str(out), "--workers", str(workers)]) == 0
    for attr, (name, cols) in STAGED.items():
        whole = pa.concat_tables([schema.conform_table(getattr(r, attr), cols, name) for r in held])
        want = schema.to_frame(whole)
        got = store.read_table(out / name)
        assert len(got) > 0
        pd.testing.assert_frame_equal(
            got, store.read_table(_written(want, tmp_path / name)), check_exact=True
        )
    assert not (out / ".staging").exists()
    err = capsys.readouterr().err
    for r in held:  # the summary still counts each file's ranges
        assert f"{r.num_events} events, {len(r.ranges)} ranges" in err


def _written(df: pd.DataFrame, path: Path) -> Path:
    store.write_table(df, path)
    return path


def test_a_staged_result_keeps_summaries_and_travels_light(tmp_path, monkeypatch):
    monkeypatch.setattr(staged, "STAGE_ROWS", 1)
    path = st.write_kineto(st.simulate(st.Job(minibatches=2)), tmp_path / "verl.json.gz")  # phase ranges
    full = ingest_file(str(path), "kineto", None, None, 0)
    r = ingest_file(str(path), "kineto", None, str(tmp_path), 0)  # its range table left the engine staged
    assert "ranges" in r.staged_tables and len(r.ranges) == 0
    before = len(pickle.dumps(full))
    stage_tables(r, str(tmp_path), 0)
    assert r.num_ranges == len(full.ranges) > 0
    assert r.phase_seconds == phase_seconds(full.ranges) and r.phase_seconds
    for attr in STAGED:
        assert len(getattr(r, attr)) == 0
        back = pa.concat_tables(staged.read_parts(r.staged_tables[attr]))
        assert back.equals(getattr(full, attr), check_metadata=True)
    # what a pool or Ray worker sends back: the three tables' rows are gone from it
    tables = sum(len(pickle.dumps(getattr(full, a))) for a in STAGED)
    assert len(pickle.dumps(r)) < before - tables // 2


def test_nothing_is_staged_without_a_folder_or_below_the_threshold(tmp_path):
    r = ingest_file(str(FILES[0]), "kineto", None, None, 0)
    n = len(r.ranges)
    assert stage_tables(r, None, 0) is r and len(r.ranges) == n and not r.staged_tables
    assert (
        n < staged.STAGE_ROWS
    )  # a small table stays in the result: staging it would cost more than it saves
    stage_tables(r, str(tmp_path), 0)
    assert len(r.ranges) == n and not r.staged_tables and r.num_ranges == n
