"""CUDA graphs in an Nsight Systems export traced whole (``--cuda-graph-trace=graph``, nsys's default): each graph
launch is one ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` row and its kernels are in no other table. vLLM's decode and
Megatron's graphed layers run that way; left unread, the device looks idle and the idle looks like host stall."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mxperf.cli import main
from tests import synthetic_traces as st

PID, DEVICE, STREAM = 4242, 0, 7
GPID = (1 << 48) | (PID << 24)
GRAPH_DDL = (
    "CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER "
    "NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, "
    "globalPid INTEGER, graphId INTEGER NOT NULL, graphExecId INTEGER NOT NULL)"
)
# (launch call name, launch start, launch end, correlation, GPU start, GPU end, what ran)
TIMELINE = (
    ("cudaLaunchKernel_v7000", 0, 10, 1, 20, 120, "kernel"),
    ("cudaGraphLaunch_v10000", 300, 320, 2, 330, 1_330, "graph"),
    ("cudaGraphLaunch_v10000", 1_400, 1_420, 3, 1_425, 2_425, "graph"),
    ("cudaGraphLaunch_v10000", 2_426, 2_428, 4, 0, 0, "graph"),  # CUPTI could not time it: left out
    ("cudaLaunchKernel_v7000", 2_430, 2_440, 5, 2_450, 2_550, "kernel"),
)


def _export(path: Path, *, graph_table: bool = True, graph_ids: bool = True) -> Path:
    con = sqlite3.connect(path)
    for ddl in (*st._NSYS_DDL, GRAPH_DDL if graph_ids else GRAPH_DDL.replace("graphId", "graphKey")):
        con.execute(ddl)
    con.executemany(
        "INSERT INTO StringIds VALUES (?, ?)",
        [(1, "cudaLaunchKernel_v7000"), (2, "cudaGraphLaunch_v10000"), (3, "eager_gemm")],
    )
    con.execute("INSERT INTO PROCESSES VALUES (?, ?, 'python3')", (GPID, PID))
    for name, l0, l1, corr, g0, g1, what in TIMELINE:
        con.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, ?, 0, NULL)",
            (l0, l1, GPID | 11, corr, 1 if name.startswith("cudaLaunch") else 2),
        )
        if what == "kernel":
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, correlationId, "
                "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
                "staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId, "
                "tensorSizeMinusOneElements) VALUES (?, ?, ?, 1, ?, ?, ?, 3, 3, 32, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, '[]')",
                (g0, g1, DEVICE, STREAM, corr, GPID),
            )
        elif graph_table:
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE VALUES (?, ?, ?, 1, NULL, ?, ?, ?, 5, 9)",
                (g0, g1, DEVICE, STREAM, corr, GPID),
            )
    con.commit()
    con.close()
    return path


def _ingest(tmp_path: Path, export: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict, Path, str]:
    out = tmp_path / "out"
    assert main(["ingest", str(export), "-o", str(out), "--no-progress"]) == 0
    devices = pq.read_table(out / "devices.parquet").to_pylist()
    assert len(devices) == 1
    return devices[0], out, capsys.readouterr().err


def test_graph_launches_traced_whole_are_busy_time_not_host_stall(tmp_path, capsys):
    d, out, err = _ingest(tmp_path, _export(tmp_path / "decode.sqlite"), capsys)
    # known truth: GPU busy [20,120) [330,1330) [1425,2425) [2450,2550); each gap's stall ends at its launch's end
    assert (d["span_ns"], d["busy_ns"], d["idle_ns"]) == (2_530, 2_200, 330)
    assert d["host_stall_ns"] == (320 - 120) + (1_420 - 1_330) + (2_440 - 2_425)
    assert d["unattributed_ns"] == 0 and d["num_kernels"] == 4
    kernels = {r["name"]: r for r in pq.read_table(out / "kernels.parquet").to_pylist()}
    assert kernels["CUDA graph 5"]["count"] == 2 and kernels["CUDA graph 5"]["total_ns"] == 2_000
    said = json.loads((out / "manifest.json").read_text())["traces"][0]["warnings"]
    assert (
        said[0].startswith("2 CUDA graph launches were traced whole") and "--cuda-graph-trace=node" in said[0]
    )
    assert said[1].startswith("1 CUDA graph launches have no timestamps")
    assert "2 CUDA graph launches were traced whole" in err


def test_export_without_graph_launches_says_nothing_of_graphs(tmp_path, capsys):
    d, out, err = _ingest(tmp_path, _export(tmp_path / "eager.sqlite", graph_table=False), capsys)
    assert (d["busy_ns"], d["num_kernels"]) == (200, 2)
    assert not json.loads((out / "manifest.json").read_text())["traces"][0].get("warnings")
    assert "CUDA graph" not in err


def test_graph_launches_without_graph_ids_are_read_unnamed(tmp_path, capsys):
    d, out, _ = _ingest(tmp_path, _export(tmp_path / "old.sqlite", graph_ids=False), capsys)
    assert (d["busy_ns"], d["num_kernels"]) == (2_200, 4)
    names = {r["name"] for r in pq.read_table(out / "kernels.parquet").to_pylist()}
    assert names == {"CUDA graph", "eager_gemm"}
