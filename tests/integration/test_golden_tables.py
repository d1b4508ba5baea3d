"""``mxperf ingest`` still gives the frozen outputs of tests/data/golden/ (tests/golden.py: cases, comparison).

One test per (case, mode), ingested in-process into tmp_path: ``held`` as a small trace goes (its range table
read whole, each process's micro-batch signals in one slab), ``bounded`` as a large one does (every range table
staged from the engine a part at a time with only its summary rows held, signals in slabs of 1,024 items). A failure names the table, column and first differing rows; regenerate only for an intended output
change (tests/data/golden/README.md).
"""

from __future__ import annotations

import json
import shutil

import golden
import pytest

from tracing import staged
from tracing.analysis import mb_engine
from tracing.outputs import store


@pytest.mark.parametrize("mode", ["held", "bounded"])
@pytest.mark.parametrize("name", golden.CASE_NAMES)
def test_ingest_matches_its_golden_output(name, mode, tmp_path, monkeypatch):
    if mode == "bounded":
        monkeypatch.setattr(staged, "STAGE_ROWS", 64)
        monkeypatch.setattr(mb_engine, "SLAB_ITEMS", 1 << 10)
    got = golden.ingest(golden.case(name), tmp_path, "off")
    diffs = golden.compare(got.out, golden.golden_dir(name), got.json_line, got.facts)
    assert diffs == [], "\n".join([f"{name} ({mode}) differs from tests/data/golden/{name}:", *diffs[:30]])


def test_the_golden_folder_holds_exactly_the_cases_and_stays_small():
    folders = {p.name for p in golden.GOLDEN.iterdir() if p.is_dir()}
    assert folders == set(golden.CASE_NAMES)
    size = sum(f.stat().st_size for f in golden.GOLDEN.rglob("*") if f.is_file())
    assert size < 3 * 2**20, f"tests/data/golden/ holds {size} bytes"


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    """One small case's output, to mutate in the tests below."""
    work = tmp_path_factory.mktemp("mutate")
    return golden.ingest(golden.case("quirk_same_stream_overlap"), work, "off")


def _copy(got: golden.Ingested, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(got.out, out)
    return out, golden.golden_dir("quirk_same_stream_overlap")


def test_compare_names_a_changed_value_and_accepts_a_reordered_table(ingested, tmp_path):
    out, gold = _copy(ingested, tmp_path)
    assert golden.compare(out, gold, ingested.json_line) == []

    ranges = store.read_table(out / store.RANGES)
    store.write_table(ranges.iloc[::-1].reset_index(drop=True), out / store.RANGES)  # row order is free
    assert golden.compare(out, gold) == []

    devices = store.read_table(out / store.DEVICES)
    devices.loc[0, "busy_ns"] += 1
    store.write_table(devices, out / store.DEVICES)
    kernels = store.read_table(out / store.KERNELS)
    assert (kernels["mean_ns"] > 0).all()
    kernels["mean_ns"] *= 1 + 1e-12  # within rel 1e-9: equal
    store.write_table(kernels, out / store.KERNELS)
    diffs = golden.compare(out, gold)
    assert len(diffs) == 1 and diffs[0].startswith("devices.parquet: column 'busy_ns': 1 of 1 rows differ"), (
        diffs
    )

    kernels.loc[1, "mean_ns"] *= 1 + 1e-6
    kernels["count"] = kernels["count"].astype("Int64")
    store.write_table(kernels, out / store.KERNELS)
    diffs = golden.compare(out, gold)
    assert any(d.startswith("kernels.parquet: column 'mean_ns': 1 of") for d in diffs), diffs
    assert "kernels.parquet: column 'count' dtype Int64 (golden int64)" in diffs


def test_compare_names_a_changed_event_a_changed_json_line_and_a_missing_table(ingested, tmp_path):
    out, gold = _copy(ingested, tmp_path)
    (events,) = golden.event_tables(out)
    ev = store.read_table(events)
    store.write_table(ev.sample(frac=1.0, random_state=1).reset_index(drop=True), events)  # reordered: equal
    assert golden.compare(out, gold) == []
    ev.loc[0, "start_ns"] += 1
    store.write_table(ev, events)
    diffs = golden.compare(out, gold)
    rel = events.relative_to(out).as_posix()
    assert any(d.startswith(f"{rel}.columns.start_ns.checksum: got") for d in diffs), diffs
    assert any(d.startswith(f"{rel}.rows_checksum: got") for d in diffs), diffs

    line = json.loads(ingested.json_line)
    line["traces"][0]["devices"][0]["busy_ns"] += 1
    diffs = golden.compare(out, gold, json.dumps(line))
    assert any(d.startswith("--json.traces[0].devices[0].busy_ns: got") for d in diffs), diffs

    (out / store.STEPS).unlink()
    assert "steps.parquet: not written (golden has it)" in golden.compare(out, gold)
