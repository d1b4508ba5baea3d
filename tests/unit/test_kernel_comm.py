"""perfmodel.kernels.comm / ``mxperf kernels``' communication table: per rank and step, time in collective
kernels and the part of it that compute kernels on other streams hide, checked against an independent sweep
over the ingest's raw event tables."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mxperf.cli import main

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples" / "runs"


def _union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _independent(ingest: Path) -> dict[int, dict[str, int]]:
    """Per rank (whole trace): comm union and its overlap with compute kernels, by a plain interval sweep."""
    classes = {
        (r["rank"], r["name"]): r["kernel_class"]
        for r in pq.read_table(
            ingest / "kernels.parquet", columns=["rank", "name", "kernel_class"]
        ).to_pylist()
    }
    out = {}
    for f in sorted((ingest / "events").glob("rank-*.parquet")):
        rank = int(f.stem.split("-")[1])
        ev = pq.read_table(f, columns=["kind", "name", "start_ns", "dur_ns"]).to_pylist()
        comm, comp = [], []
        for e in ev:
            if e["kind"] != "kernel" or e["dur_ns"] <= 0:
                continue
            cls = classes.get((rank, e["name"]), "other")
            iv = (e["start_ns"], e["start_ns"] + e["dur_ns"])
            (comm if cls == "communication" else comp).append(iv) if cls not in ("memcpy", "memset") else None
        cu, ku = _union(comm), _union(comp)
        ov = sum(max(0, min(ce, ke) - max(cs, ks)) for cs, ce in cu for ks, ke in ku)
        out[rank] = {"union": sum(e - s for s, e in cu), "overlap": ov}
    return out


def test_two_ranks_against_an_independent_sweep(capsys) -> None:
    ing = EX / "ingest-2rank"
    assert main(["kernels", str(ing), "--top", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["communication"]
    truth = _independent(ing)
    rows = {r["rank"]: r for r in doc["per_rank_step"]}
    assert set(rows) == set(truth) == {0, 1}
    for rank, t in truth.items():
        r = rows[rank]
        assert r["step"] == -1  # no micro-batches in this ingest: no step
        assert r["comm_union_ns"] == t["union"] and r["overlapped_ns"] == t["overlap"]
        assert r["exposed_ns"] == t["union"] - t["overlap"]
        assert 0 < r["overlap_share"] < 1
    assert doc["unassigned_ns"] == doc["comm_ns"] == sum(r["comm_ns"] for r in rows.values())


def test_steps_of_the_simulated_verl_run(capsys) -> None:
    ing = EX / "ingest-verl-sim-mxfp8"
    assert main(["kernels", str(ing), "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert "communication kernels" in text and "overlap %" in text
    assert main(["kernels", str(ing), "--top", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["communication"]
    steps = [r["step"] for r in doc["per_rank_step"]]
    assert steps == sorted(steps) and min(steps) >= 0  # every collective follows a micro-batch of its step
    for r in doc["per_rank_step"]:
        assert r["step_ns"] and r["exposed_share_of_step"] == pytest.approx(r["exposed_ns"] / r["step_ns"])
    truth = _independent(ing)[0]
    assert sum(r["comm_union_ns"] for r in doc["per_rank_step"]) == truth["union"]
    assert sum(r["overlapped_ns"] for r in doc["per_rank_step"]) == truth["overlap"]
