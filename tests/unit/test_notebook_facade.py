"""``mxperf.open(p)``: tracing.open's tables unchanged, plus ``kernel_summary()`` (the numbers ``mxperf kernels
--json`` prints, on the ingest of a real trace in tests/data) and ``diff(other)`` (the ``mxperf diff --json``
document, whose parts add up to the difference measured from the ingests' own tables)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

import mxperf
import tracing
from mxperf.cli import main
from perfmodel.kernels.diff import PARTS
from tracing.outputs.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples" / "runs"
REAL = EX / "ingest-2rank"  # mxperf ingest tests/data/real/hta_sampled_2rank/rank-{0,1}.json.gz
A, B = EX / "ingest-verl-sim-bf16", EX / "ingest-verl-sim-mxfp8"


def _cli(argv: list[str], capsys) -> dict:
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    doc.pop("schema_version")
    return doc


def test_kernel_summary_is_the_cli_json_on_a_real_trace(capsys) -> None:
    doc = _cli(["kernels", str(REAL), "--top", "0", "--json"], capsys)
    df = mxperf.open(REAL).kernel_summary()
    assert df.attrs["busy_ns"] == doc["busy_ns"] and df.attrs["op_ns"] == doc["op_ns"]
    for level, rows in (("class", doc["classes"]), ("kernel", doc["kernels"])):
        got = df[df["level"] == level].sort_values("position")
        assert len(got) == len(rows) > 1
        for (_, g), r in zip(got.iterrows(), rows, strict=True):
            assert g["kernel_class"] == r["kernel_class"]
            assert (g["count"], g["total_ns"], g["max_ns"]) == (r["count"], r["total_ns"], r["max_ns"])
            assert math.isclose(g["share_of_busy"], r["share_of_busy"], rel_tol=1e-12)
            if level == "kernel":
                assert g["name"] == r["name"]
    # every op of the ingest is in one class row; the kernel rows (all of them) hold the same time
    assert df.loc[df["level"] == "class", "total_ns"].sum() == doc["op_ns"]
    assert df.loc[df["level"] == "kernel", "total_ns"].sum() == doc["op_ns"]


def test_the_object_keeps_every_table_of_tracing_open() -> None:
    mine, theirs = mxperf.open(REAL), tracing.open(REAL)
    assert isinstance(mine, type(theirs))
    for method in ("devices", "streams", "ranges", "kernels", "steps"):
        pd.testing.assert_frame_equal(getattr(mine, method)(), getattr(theirs, method)())


def _measured_ns(t: mxperf.Tables) -> tuple[dict[int, int], dict[tuple[str, int], float]]:
    """Per step, summed phase time (steps.parquet); per (phase, size), mean micro-batch window -- read here with
    pandas from the ingest's tables, not through the diff's DuckDB."""
    st = t.steps()
    st = st[(st["pid"] >= 0) & st["seconds"].notna()]
    per_step = {
        int(s): int(sum(round(v * 1e9) for v in g["seconds"])) for s, g in st.groupby("step", sort=True)
    }
    mb = t.microbatches()
    mb = mb.assign(wall=mb["end_ns"] - mb["start_ns"])
    per_size = {
        (str(p), int(n)): float(g["wall"].mean())
        for (p, n), g in mb.groupby(["phase", "tokens_per_microbatch"])
    }
    return per_step, per_size


def test_diff_is_the_cli_json_and_adds_up_to_the_measured_difference(capsys) -> None:
    a, b = mxperf.open(A), mxperf.open(B)
    doc = a.diff(b)
    assert doc == _cli(["diff", str(A), str(B), "--json"], capsys)
    assert a.diff(str(B)) == doc  # a path does as well as an opened ingest
    steps_a, size_a = _measured_ns(a)
    steps_b, size_b = _measured_ns(b)
    assert doc["by_step"] and doc["by_size"] and doc["by_phase"]
    for r in doc["by_step"]:
        d = r["delta"]
        assert d["wall_ns"] == steps_b[r["step"]] - steps_a[r["step"]]  # the measured difference, exactly
        assert d["wall_ns"] == sum(d[p] for p in PARTS) + d["outside_ns"]  # integer ns: nothing hidden
    for r in doc["by_size"]:
        d, key = r["delta"], (r["phase"], r["tokens"])
        assert d["wall_ns"] == pytest.approx(size_b[key] - size_a[key], abs=1e-6)
        assert d["wall_ns"] == pytest.approx(sum(d[p] for p in PARTS), abs=1e-6)
    for r in doc["by_phase"]:
        d = r["delta"]
        assert d["wall_ns"] == pytest.approx(sum(d[p] for p in PARTS) + d["outside_ns"], abs=1e-6)
    # the MXFP8 side's casts are a part the diff names: added time, not hidden in the residual
    upd = next(r for r in doc["by_phase"] if r["phase"] == "update")
    assert upd["delta"]["quantize_ns"] > 0 > upd["delta"]["gemm_ns"]


def test_diff_on_another_device_is_the_cli_what_if(capsys) -> None:
    doc = mxperf.open(A).diff(B, on="gb200", device="b200")
    assert (
        doc["what_if"]
        == _cli(["diff", str(A), str(B), "--on", "gb200", "--device", "b200", "--json"], capsys)["what_if"]
    )
    with pytest.raises(InputError, match="give on= too"):
        mxperf.open(A).diff(B, device="b200")


def test_a_trace_file_has_the_tables_but_no_kernel_summary() -> None:
    trace = ROOT / "tests" / "data" / "real" / "hta_sampled_2rank" / "rank-0.json.gz"
    t = mxperf.open(trace)
    assert len(t.devices()) >= 1  # tracing.open's tables work on a file
    with pytest.raises(InputError, match="reads an `mxperf ingest` folder; run mxperf ingest"):
        t.kernel_summary()
    with pytest.raises(InputError, match="no such file or folder"):
        mxperf.open(ROOT / "no-such-ingest")
