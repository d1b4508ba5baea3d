"""The range table read a part at a time, and the rows the other tables read (``range_tables.summary_rows``),
give what the whole table gives: the same parts concatenated, and the same micro-batch regions, step table and
seconds per phase from the summary rows alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import synthetic_traces as st

from tracing.analysis import gpu_tables, mbregions, range_tables, steps
from tracing.analysis.phases import default_phase_map
from tracing.ingest import engine
from tracing.ingest.detect import load_trace
from tracing.staged import phase_seconds

REAL = Path(__file__).resolve().parents[1] / "data" / "real"


def _traces(tmp: Path) -> list[tuple[Path, str]]:
    verl = st.write_kineto(st.simulate(st.Job(minibatches=3)), tmp / "verl.json.gz")
    meg = st.write_kineto(st.simulate(st.Job(framework="megatron", minibatches=2)), tmp / "meg.json.gz")
    return [
        (REAL / "hta_a100_ddp_rank0_hostbound.json.gz", "kineto"),
        (REAL / "hta_sampled_2rank" / "rank-0.json.gz", "kineto"),
        (REAL / "nsysai_h100x2_mfu_before.sqlite", "nsys"),
        (verl, "kineto"),
        (meg, "kineto"),
    ]


def _frame(t: pa.Table) -> pd.DataFrame:
    return engine.frame(t, range_tables.schema.RANGE_COLUMNS)


def _table(t: pa.Table) -> pa.Table:
    return engine.table(t, range_tables.schema.RANGE_COLUMNS)


@pytest.mark.parametrize("pattern", [None, r"update/microbatch.*"])
def test_parts_and_summary_rows_give_what_the_whole_table_gives(tmp_path: Path, pattern: str | None) -> None:
    for path, fmt in _traces(tmp_path):
        trace = load_trace(path, fmt)
        with engine.session() as con:
            engine.register_frame(con, trace.events)
            n_ops = gpu_tables.make_ops(con)
            range_tables.make_ranges(con)
            source = "nvtx" if fmt == "nsys" else "user_annotation"
            n = range_tables.make_range_rows(con, default_phase_map(), source, n_ops)
            whole_t = range_tables.range_table(con, default_phase_map(), source, n_ops)
            whole = _frame(whole_t)
            parts = [pa.Table.from_batches([b]) for b in range_tables.range_parts(con, 997)]
            summary = _table(range_tables.summary_rows(con, pattern))
        assert n == len(whole) > 0
        pd.testing.assert_frame_equal(_frame(pa.concat_tables(parts)), whole, check_exact=True)
        whole = _table(whole_t)  # the functions below read Arrow tables (mxperf ingest imports no pandas)
        assert len(summary) < len(whole) or len(whole) < 100, path  # a summary, not the table
        got, want = mbregions.find_regions(summary, pattern), mbregions.find_regions(whole, pattern)
        assert got[0] == want[0] and got[2] == want[2], path
        assert got[1].equals(want[1])
        got_steps, want_steps = steps.step_windows(summary), steps.step_windows(whole)
        assert got_steps.keys() == want_steps.keys()
        for c in got_steps:
            np.testing.assert_array_equal(got_steps[c], want_steps[c])
        sw, ss = whole.filter(steps.step_rows(whole)), summary.filter(steps.step_rows(summary))
        assert ss.equals(sw)
        assert phase_seconds(summary) == phase_seconds(whole)
        assert set(summary.column("pid").to_pylist()) == set(whole.column("pid").to_pylist())
