"""A table written in parts reads back as the table written whole, with each later part's categoricals carrying
only the categories it uses (an emit_nvtx export's names are all distinct: each row group would otherwise hold
every one of them)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tracing.outputs import store


def _table(n: int = 20_000, k: int = 5_000) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    cats = [f"aten::mm, op_id = {i}" for i in rng.permutation(k)]  # categories in no sorted order
    return pd.DataFrame(
        {
            # names in the order they were met, as emit_nvtx's op ids: a part meets a few of them
            "name": pd.Categorical.from_codes(np.sort(rng.integers(0, k, n)).astype(np.int32), cats),
            "kind": pd.Categorical.from_codes(
                rng.integers(0, 3, n).astype(np.int8), ["kernel", "cpu_op", "range"]
            ),
            "start_ns": np.arange(n, dtype=np.int64),
        }
    )


def test_parts_read_back_as_the_whole_table_with_smaller_row_groups(tmp_path):
    df = _table()
    store.write_table(df, tmp_path / "whole.parquet")
    parts = [df.iloc[a : a + 3_000].reset_index(drop=True) for a in range(0, len(df), 3_000)]
    store.write_table_parts(parts, tmp_path / "parts.parquet")
    whole, got = (store.read_table(tmp_path / f) for f in ("whole.parquet", "parts.parquet"))
    pd.testing.assert_frame_equal(got, whole, check_exact=True)
    assert list(got["name"].cat.categories) == list(df["name"].cat.categories)  # every one, in their order
    meta = pq.ParquetFile(tmp_path / "parts.parquet").metadata
    sizes = [meta.row_group(i).column(0).total_compressed_size for i in range(meta.num_row_groups)]
    assert (
        meta.num_row_groups == len(parts) and max(sizes[1:]) < sizes[0] / 2
    )  # later dictionaries: used names


def test_a_part_using_few_categories_still_matches_the_first_parts_schema(tmp_path):
    df = _table(n=1_000, k=300)  # 300 categories: int16 codes; a later part with under 128 used: int8
    parts = [df, df.iloc[:5].reset_index(drop=True)]
    store.write_table_parts(parts, tmp_path / "t.parquet")
    got = store.read_table(tmp_path / "t.parquet")
    pd.testing.assert_frame_equal(got, pd.concat(parts, ignore_index=True), check_exact=True)


@pytest.mark.parametrize("k", [1, 126, 127, 128, 32_766, 32_767, 40_000])
def test_a_coded_table_is_the_frames_arrow_table_schema_and_pandas_metadata_included(k):
    """Around each size where pandas widens a categorical's codes (int8 / int16 / int32), with missing codes."""
    rng = np.random.default_rng(k)
    codes = rng.integers(-1, k, 500)
    cats = [f"n{i}" for i in rng.permutation(k)]
    frame = pd.DataFrame(
        {
            "start_ns": np.arange(500, dtype=np.int64),
            "name": pd.Categorical.from_codes(codes.astype(np.int32), cats),
            "kind": pd.Categorical.from_codes((codes % 3).astype(np.int8), ["kernel", "cpu_op", "range"]),
        }
    )
    got = store.coded_table(
        {"start_ns": frame["start_ns"].to_numpy(), "name": codes, "kind": codes % 3},
        {"name": cats, "kind": ["kernel", "cpu_op", "range"]},
    )
    assert got.equals(pa.Table.from_pandas(frame, preserve_index=False), check_metadata=True)


def _coded_parts(codes: np.ndarray, cats: list[str], rows: int):
    shares = store.CarriedCategories({"name": len(cats)})
    bounds = list(range(0, len(codes), rows))
    for i, a in enumerate(bounds):
        part = {
            "start_ns": np.arange(a, min(a + rows, len(codes)), dtype=np.int64),
            "name": codes[a : a + rows],
        }
        yield store.coded_table(part, {"name": cats}, shares.carry(part, last=i == len(bounds) - 1))


def test_parts_carrying_a_share_of_the_categories_read_back_as_the_whole_table(tmp_path):
    """Names met as the rows come (codes growing with the rows, as emit_nvtx's op ids), some never used (at the
    start, between, after the last used), and a first part that also uses a late name: every category comes
    back, in code order, while a part's dictionary holds about the names it uses, not all of them."""
    k, n, rows = 6_000, 20_000, 2_000
    rng = np.random.default_rng(1)
    codes = np.sort(rng.integers(50, k - 300, n))
    codes[codes % 97 == 0] = -1  # missing names
    codes[7] = k - 400  # the first part reaches far ahead
    cats = [f"aten::mm, op_id = {i}" for i in rng.permutation(k)]
    whole = pd.DataFrame(
        {
            "start_ns": np.arange(n, dtype=np.int64),
            "name": pd.Categorical.from_codes(codes.astype(np.int32), cats),
        }
    )
    store.write_table(whole, tmp_path / "whole.parquet")
    store.write_table_parts(_coded_parts(codes, cats, rows), tmp_path / "parts.parquet")
    want, got = (store.read_table(tmp_path / f) for f in ("whole.parquet", "parts.parquet"))
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert list(got["name"].cat.categories) == cats  # unused ones too, in their order
    assert pq.read_schema(tmp_path / "parts.parquet").equals(
        pq.read_schema(tmp_path / "whole.parquet"), check_metadata=True
    )
    f = pq.ParquetFile(tmp_path / "parts.parquet")
    sizes = [
        len(f.read_row_group(i, ["name"]).column(0).chunk(0).dictionary) for i in range(f.num_row_groups)
    ]
    assert (
        sizes[0] > k - 400 and max(sizes[1:-1]) < 2 * rows
    )  # the first reaches far; the others: what they use
