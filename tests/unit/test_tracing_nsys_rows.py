"""An nsys export's event rows read as Arrow batches (ADBC's SQLite driver): exact int64 values in rowid order
whatever the batch size, a REAL truncated like ``int()``, and a value that is no integer one clear line."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tracing.ingest import decoded, nsys
from tracing.outputs.errors import TraceFormatError

NSYS = Path(__file__).parent.parent / "data" / "real" / "nsysai_h100x2_mfu_before.sqlite"


def _edited_copy(path: Path, sql: str) -> Path:
    shutil.copy(NSYS, path)
    con = sqlite3.connect(path)
    con.execute(sql)
    con.commit()
    con.close()
    return path


def test_rows_equal_a_plain_select_in_rowid_order_in_any_batch_size(tmp_path, monkeypatch):
    p = tmp_path / "x.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE x (a INTEGER, b INTEGER, t TEXT)")
    rows = [(i * 7 - 20, -(2**62) + i, f"name {i % 3}, with comma") for i in range(11)]
    rows[4] = (5.75, None, None)  # a REAL, a NULL with a default, a NULL text
    con.executemany("INSERT INTO x VALUES (?, ?, ?)", rows)
    con.execute("DELETE FROM x WHERE rowid = 3")  # a gap in the rowids
    con.commit()
    want = [(int(a), -1 if b is None else b, t) for (a, b, t) in rows if (a, b, t) != rows[2]]
    for batch in (1, 3, 1 << 16):
        monkeypatch.setattr(nsys, "BATCH_ROWS", batch)
        reader = nsys.open_rows(p)
        try:
            got = list(nsys._rows(p, reader, "x", [nsys._int("a"), nsys._int("b", -1)], text="t"))
        finally:
            reader.close()
        assert len(got) == (len(want) + batch - 1) // batch
        m = np.concatenate([g[0] for g in got])
        assert m.dtype == np.int64
        assert m.tolist() == [[a, b] for a, b, _ in want]
        assert [t for _, texts in got for t in texts] == [t for _, _, t in want]


def test_a_real_export_reads_the_same_in_small_batches(monkeypatch):
    ref = decoded.load_nsys_events(NSYS).events
    monkeypatch.setattr(nsys, "BATCH_ROWS", 1000)
    pd.testing.assert_frame_equal(decoded.load_nsys_events(NSYS).events, ref)


def test_a_real_value_in_the_export_is_truncated_like_int(tmp_path):
    p = _edited_copy(
        tmp_path / "real_value.sqlite", 'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = "end" + 0.5'
    )
    pd.testing.assert_frame_equal(decoded.load_nsys_events(p).events, decoded.load_nsys_events(NSYS).events)


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = 'soon' WHERE rowid = 10",
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET \"end\" = x'01' WHERE rowid = 10",
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 1e30 WHERE rowid = 2",
    ],
)
def test_a_value_that_is_no_integer_is_one_clear_line(tmp_path, sql):
    p = _edited_copy(tmp_path / "bad_value.sqlite", sql)
    with pytest.raises(
        TraceFormatError, match=r"bad_value\.sqlite: unexpected value in an nsys table \((CUPTI|NVTX)"
    ):
        decoded.load_nsys_events(p)
