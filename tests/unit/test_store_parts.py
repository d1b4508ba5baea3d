"""A table written in parts reads back as the table written whole, with each later part's categoricals carrying
only the categories it uses (an emit_nvtx export's names are all distinct: each row group would otherwise hold
every one of them)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

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
