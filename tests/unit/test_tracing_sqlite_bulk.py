"""The bulk SQLite reader gives exactly what a plain SELECT gives, or steps aside (None) so the row path runs."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tracing.ingest import decoded, sqlite_bulk
from tracing.outputs.errors import TraceFormatError

DATA = Path(__file__).parent.parent / "data"
NSYS = DATA / "real" / "nsysai_h100x2_mfu_before.sqlite"
QUIRK_SQL = DATA / "quirks" / "nsys_unmatched_push_pop" / "schema.sql"


def _db(rows: list[tuple], decl: str = "a INTEGER, b INTEGER, t TEXT") -> sqlite3.Connection:
    con = sqlite3.connect(":memory:")
    con.execute(f"CREATE TABLE x ({decl})")
    con.executemany("INSERT INTO x VALUES (?, ?, ?)", rows)
    return con


def _plain(con: sqlite3.Connection, exprs: list[str], text: str | None, where: str = "") -> tuple:
    cols = ", ".join([*exprs, *([text] if text else [])])
    rows = con.execute(f"SELECT {cols} FROM x AS n {'WHERE ' + where if where else ''}").fetchall()
    k = len(exprs)
    return np.array([r[:k] for r in rows], np.int64).reshape(len(rows), k), [
        r[k] for r in rows
    ] if text else []


@pytest.mark.parametrize("block_rows", [1, 3, 1 << 18])
def test_bulk_columns_equal_a_plain_select_across_blocks(monkeypatch, block_rows):
    monkeypatch.setattr(sqlite_bulk, "BLOCK_ROWS", block_rows)
    rows = [(i * 7 - 20, -(2**62) + i, f"name {i % 3}, with comma") for i in range(10)]
    rows[4] = (rows[4][0], rows[4][1], "")  # an empty name
    con = _db(rows)
    con.execute("DELETE FROM x WHERE a = 1")  # a gap in the rowids
    got = sqlite_bulk.select_columns(con, "x", ["a", "b"], "t", "n.a != 15")
    assert got is not None
    m, texts = got
    ref_m, ref_t = _plain(con, ["a", "b"], "t", "n.a != 15")
    assert np.array_equal(m, ref_m) and texts == ref_t and len(texts) == 8


def test_empty_table_and_empty_selection_give_empty_columns():
    con = _db([])
    m, texts = sqlite_bulk.select_columns(con, "x", ["a", "b"], "t")
    assert m.shape == (0, 2) and texts == []
    con = _db([(1, 2, "x")])
    m, texts = sqlite_bulk.select_columns(con, "x", ["a", "b"], None, "n.a > 5")
    assert m.shape == (0, 2) and texts == []


@pytest.mark.parametrize(
    "bad",
    [
        (5.0, 1, "real that is whole"),
        (5.5, 1, "real"),
        ("12abc", 1, "text"),
        (None, 1, "null"),
        (2**63 - 1, 1, "int64 max: numpy clamps, so the limit itself is not trusted"),
        (1, 1, "a name with a \x00 separator"),
    ],
)
def test_values_that_would_not_round_trip_step_aside(bad):
    con = _db([(1, 2, "ok"), bad], "a, b, t")  # no column affinity: values keep their type
    assert sqlite_bulk.select_columns(con, "x", ["a", "b"], "t") is None


def test_a_block_longer_than_sqlites_string_limit_steps_aside():
    con = _db([(i, i, "x" * 20) for i in range(10)])
    con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 100)  # each value fits; a column's group_concat does not
    assert sqlite_bulk.select_columns(con, "x", ["a", "b"], "t") is None


def test_a_view_has_no_rowid_and_steps_aside():
    con = _db([(1, 2, "a")])
    con.execute("CREATE VIEW v AS SELECT a, b FROM x")
    assert sqlite_bulk.select_columns(con, "v", ["a", "b"]) is None


def test_real_export_bulk_and_row_paths_give_identical_tables():
    bulk = decoded.load_nsys_events(NSYS, bulk=True)
    rows = decoded.load_nsys_events(NSYS, bulk=False)
    pd.testing.assert_frame_equal(bulk.events, rows.events)
    assert bulk.meta == rows.meta


def test_quirk_export_bulk_and_row_paths_give_identical_tables(tmp_path):
    p = tmp_path / "quirk.sqlite"
    con = sqlite3.connect(p)
    con.executescript(QUIRK_SQL.read_text())
    con.close()
    pd.testing.assert_frame_equal(
        decoded.load_nsys_events(p, bulk=True).events, decoded.load_nsys_events(p, bulk=False).events
    )


def _edited_copy(path: Path, sql: str) -> Path:
    shutil.copy(NSYS, path)
    con = sqlite3.connect(path)
    con.execute(sql)
    con.commit()
    con.close()
    return path


def test_a_real_value_in_the_export_falls_back_to_the_row_path(tmp_path):
    sql = 'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = "end" + 0.5 WHERE rowid = 3'
    p = _edited_copy(tmp_path / "real_value.sqlite", sql)
    ref = decoded.load_nsys_events(NSYS, bulk=True).events
    got = decoded.load_nsys_events(p).events
    assert len(got) == len(ref)  # the row path truncates 0.5 like int(), so the table is the same
    pd.testing.assert_frame_equal(got, ref)


def test_a_text_start_is_still_a_clear_error(tmp_path):
    sql = "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = 'soon' WHERE rowid = 10"
    p = _edited_copy(tmp_path / "text_start.sqlite", sql)
    with pytest.raises(TraceFormatError, match=r"text_start\.sqlite: unexpected value in an nsys table"):
        decoded.load_nsys_events(p)


@pytest.mark.parametrize("block_rows", [1, 3, 4, 1 << 18])
def test_select_blocks_gives_a_plain_select_block_by_block(monkeypatch, block_rows):
    # the streaming nsys reader: rowid blocks in order; a block the bulk text cannot reproduce (a REAL, a
    # NULL text) is read row by row on its own, the other blocks stay in bulk
    monkeypatch.setattr(sqlite_bulk, "BLOCK_ROWS", block_rows)
    rows = [(i * 7 - 20, i, f"name {i % 3}") for i in range(11)]
    rows[5] = (5.0, 5, None)
    con = _db(rows)
    con.execute("DELETE FROM x WHERE rowid = 3")  # a gap in the rowids
    blocks = list(sqlite_bulk.select_blocks(con, "x", ["a", "b"], text="t", where="n.b != 8"))
    assert all(len(m) for m, _ in blocks) and len(blocks) >= (1 if block_rows > 11 else 3)
    ref_m, ref_t = _plain(con, ["a", "b"], "t", "n.b != 8")
    assert np.array_equal(np.concatenate([m for m, _ in blocks]), ref_m)
    assert [t for _, texts in blocks for t in texts] == ref_t and None in ref_t
    assert list(sqlite_bulk.select_blocks(_db([]), "x", ["a"])) == []
