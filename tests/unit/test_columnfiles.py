"""Column files: rows written once in (group, key) order and found / read back by row range give what
searching and slicing the same columns in memory gives, across sparse-index and block boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from tracing.ingest.columnfiles import ColumnFiles

DTYPES = {"key": np.dtype(np.int64), "small": np.dtype(np.int32), "flag": np.dtype(bool)}


def _rows(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    group = np.sort(rng.choice([-3, 0, 5, 9], n))
    key = rng.integers(0, 500, n)  # many ties: a window edge falls inside a run of equal keys
    order = np.lexsort((key, group))
    return {
        "group": group[order],
        "key": key[order],
        "small": rng.integers(-(2**31), 2**31 - 1, n).astype(np.int32),
        "flag": rng.random(n) < 0.5,
    }


@pytest.mark.parametrize("every", [1, 7, 64])
@pytest.mark.parametrize("seed", range(4))
def test_find_and_read_are_searchsorted_and_slicing(tmp_path, every, seed):
    rng = np.random.default_rng(seed)
    rows = _rows(rng, 3_000)
    store = ColumnFiles(tmp_path / "c", DTYPES, "group", "key", every=every)
    for a in range(0, 3_000, 211):  # chunks that split groups and sparse-index strides
        store.append({c: v[a : a + 211] for c, v in rows.items()})
    store.finish()
    try:
        assert store.rows == 3_000
        for g in [-3, 0, 5, 9, 4]:  # 4: no rows
            rg = np.flatnonzero(rows["group"] == g)
            base = int(rg[0]) if len(rg) else 0
            keys = rows["key"][rg]
            for lo, hi in [
                (0, 499),
                (-5, 600),
                (17, 17),
                (250, 251),
                (300, 100),
                *rng.integers(0, 500, (20, 2)),
            ]:
                got = store.find(g, int(lo), int(hi))
                a = base + int(np.searchsorted(keys, lo, side="left"))
                b = max(a, base + int(np.searchsorted(keys, hi, side="right")))
                assert (got.start, got.stop) == (a, b), (g, lo, hi)
                read = store.read(got, ("key", "small", "flag"))
                for c in ("key", "small", "flag"):
                    np.testing.assert_array_equal(read[c], rows[c][a:b])
                    assert read[c].dtype == DTYPES[c]
                blocks = list(store.blocks(got, ("small",), 13))
                assert all(len(x["small"]) <= 13 for x in blocks)
                joined = np.concatenate([np.zeros(0, np.int32), *(x["small"] for x in blocks)])
                np.testing.assert_array_equal(joined, rows["small"][a:b])
    finally:
        store.close()
    assert not list((tmp_path / "c").iterdir())  # close removes the files


def test_a_group_appended_again_after_another_is_refused(tmp_path):
    store = ColumnFiles(tmp_path / "c", DTYPES, "group", "key")
    one = {
        "group": np.array([1, 2]),
        "key": np.array([5, 6]),
        "small": np.zeros(2, np.int32),
        "flag": np.ones(2, bool),
    }
    store.append(one)
    with pytest.raises(ValueError, match="group 1 appended after"):
        store.append({**one, "group": np.array([1, 1])})
    store.close()


def test_appended_chunks_are_not_kept_alive(tmp_path):
    """What is held while appending is the sparse index (a key every ``every`` rows), not the chunks: 50 chunks
    of 20,000 rows (160 kB of keys each) leave under 100 kB traced once they are dropped (8 MB when the index
    was a view of each chunk's keys)."""
    import tracemalloc

    store = ColumnFiles(tmp_path / "c", DTYPES, "group", "key", every=1024)
    tracemalloc.start()
    try:
        for a in range(50):
            n = 20_000
            store.append(
                {
                    "group": np.zeros(n, np.int64),
                    "key": np.arange(a * n, (a + 1) * n, dtype=np.int64),
                    "small": np.zeros(n, np.int32),
                    "flag": np.zeros(n, bool),
                }
            )
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        store.close()
    assert held < 100_000, held
