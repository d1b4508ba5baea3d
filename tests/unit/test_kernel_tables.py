"""``mxperf kernels --parquet``: the table read back holds, row by row, the numbers ``--json`` prints (on the
ingest of a real two-rank trace in tests/data and on the simulated verl ingest with micro-batches)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mxperf.cli import main
from perfmodel.kernels.tables import FIXED_COLUMNS
from tracing.outputs import store

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples" / "runs"
REAL = EX / "ingest-2rank"  # mxperf ingest tests/data/real/hta_sampled_2rank/rank-{0,1}.json.gz
SIM = EX / "ingest-verl-sim-bf16"


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12)
    return a == b


@pytest.mark.parametrize(("ingest", "top"), [(REAL, 0), (SIM, 4)], ids=["real-2rank", "verl-sim"])
def test_the_parquet_table_holds_the_json_numbers(ingest: Path, top: int, tmp_path: Path, capsys) -> None:
    out = tmp_path / "ks.parquet"
    assert main(["kernels", str(ingest), "--top", str(top), "--json", "--parquet", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = pq.read_table(out).to_pylist()
    assert list(pq.read_schema(out).names[: len(FIXED_COLUMNS)]) == list(FIXED_COLUMNS)
    want = [("class", i, r) for i, r in enumerate(doc["classes"])]
    want += [("kernel", i, r) for i, r in enumerate(doc["kernels"])]
    assert len(rows) == len(want) and len(doc["kernels"]) > 1
    phases = sorted({p for _, _, r in want for p in r["per_phase_ns"]} | set(doc["microbatches"]))
    for row, (level, i, r) in zip(rows, want, strict=True):
        assert (row["level"], row["position"], row["kernel_class"]) == (level, i, r["kernel_class"])
        assert row["name"] == (r["name"] if level == "kernel" else None)
        for c in ("count", "total_ns", "max_ns", "mean_ns", "share_of_busy"):
            assert _same(row[c], r[c]), (c, row[c], r[c])
        shape = (r.get("shapes") or [None])[0]
        assert row["top_shapes"] == (shape["shapes"] if shape else None)
        assert row["top_shape_count"] == (shape["count"] if shape else None)
        for p in phases:
            assert row[f"per_phase_ns.{p}"] == r["per_phase_ns"].get(p, 0)
            mb = row[f"per_microbatch_ns.{p}"]
            if p in r["per_microbatch_ns"]:
                assert _same(mb, r["per_microbatch_ns"][p])
            else:  # no op of this row in p's micro-batches: 0 when p has micro-batches, else null
                assert mb == (0.0 if doc["microbatches"].get(p) else None)
    if ingest == SIM:  # micro-batches and recorded GEMM shapes: those columns are filled, not all null
        assert any(r["top_shapes"] for r in rows) and rows[0]["per_microbatch_ns.update"] > 0
    # the class rows cover every op; the ingest-wide figures ride in the metadata
    assert sum(r["total_ns"] for r in rows if r["level"] == "class") == doc["op_ns"]
    meta = store.table_meta(out)
    assert {k: meta[k] for k in ("busy_ns", "ops", "op_ns", "microbatches")} == {
        k: doc[k] for k in ("busy_ns", "ops", "op_ns", "microbatches")
    }


def test_the_parquet_target_is_checked_before_any_work(tmp_path: Path, capsys) -> None:
    (tmp_path / "taken.parquet").write_bytes(b"mine")
    cases = [
        (["--parquet", str(tmp_path / "taken.parquet")], "exists; choose another --parquet or pass --force"),
        (["--parquet", str(tmp_path / "ks.csv")], "name it .parquet"),
        (["--parquet", str(tmp_path)], "is a folder"),
        (["--parquet", str(SIM / "ks.parquet")], "inside the ingest folder"),
        (["--force"], "give --parquet FILE too"),
    ]
    for extra, needle in cases:
        assert main(["kernels", str(SIM), *extra]) == 2
        assert needle in capsys.readouterr().err
    assert (tmp_path / "taken.parquet").read_bytes() == b"mine" and not (SIM / "ks.parquet").exists()
    assert main(["kernels", str(SIM), "--parquet", str(tmp_path / "taken.parquet"), "--force"]) == 0
    assert pq.read_table(tmp_path / "taken.parquet").num_rows > 0
