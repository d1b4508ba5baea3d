"""A NeMo RL worker's nsys export: its file name (worker, profiled steps, pid), its rank (the RANK its Ray
worker group set, recorded in the environment nsys ran in), and its worker NVTX ranges mapped to phases.

NeMo RL names a report ``<worker>_<NRL_NSYS_PROFILE_STEP_RANGE>_%p`` (nemo_rl/distributed/
worker_group_utils.py) and pushes ``<worker>/<method>`` NVTX ranges (nemo_rl/utils/nsys.py
``wrap_with_nvtx_name``); the export built here has that layout, in the tables an ``nsys export --type
sqlite`` writes (the subset mxperf reads)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from mxperf.cli import main
from tracing.analysis import attribution
from tracing.ingest.decoded import load_nsys_events
from tracing.ingest.trace import rank_from_environment, rank_from_name, report_name
from tracing.outputs import store

PID = 4242
G_TID = (PID << 24) | PID  # nsys globalTid packs pid and tid
G_PID = PID << 24

_SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, "end" INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
  category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
  domainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, "end" INTEGER NOT NULL,
  eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
  returnValue INTEGER NOT NULL, callchainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, "end" INTEGER NOT NULL,
  deviceId INTEGER NOT NULL, contextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER,
  globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL);
CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INTEGER, devStateName TEXT NOT NULL, name TEXT NOT NULL,
  nameEnum INTEGER NOT NULL, value TEXT NOT NULL);
INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel_v7000'), (2, 'nvjet_tst_gemm_kernel');
"""

# (name, start_ns, end_ns): one profiled NeMo RL GRPO step on a colocated Megatron policy worker.
RANGES = [
    ("megatron_policy_worker/get_logprobs", 1_000, 5_000),
    ("megatron_policy_worker/get_reference_policy_logprobs", 5_000, 8_000),
    ("megatron_policy_worker/train", 9_000, 20_000),
    ("megatron.core.transformer.attention.forward.core_attention", 10_000, 11_000),  # Megatron internals
    ("megatron_policy_worker/offload_before_refit", 21_000, 22_000),
    ("megatron_policy_worker/stream_weights_via_ipc_zmq", 22_000, 26_000),
    ("megatron_policy_worker/offload_after_refit", 26_000, 27_000),
]
PHASES = {
    "megatron_policy_worker/get_logprobs": "logprob",
    "megatron_policy_worker/get_reference_policy_logprobs": "logprob",
    "megatron_policy_worker/train": "update",
    "megatron.core.transformer.attention.forward.core_attention": "other",
    "megatron_policy_worker/offload_before_refit": "sync",
    "megatron_policy_worker/stream_weights_via_ipc_zmq": "sync",
    "megatron_policy_worker/offload_after_refit": "sync",
}


def _export(path: Path, environment: str, pids: tuple[int, ...] = (PID,)) -> Path:
    con = sqlite3.connect(path)
    con.executescript(_SCHEMA)
    con.executemany(
        "INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, NULL, NULL, NULL, ?, ?, NULL, NULL, 0)",
        [(s, e, n, G_TID) for n, s, e in RANGES],
    )
    corr = 0
    for _name, s, e in RANGES:  # one launch + kernel inside each range, on each GPU process
        for pid in pids:
            corr += 1
            gtid = (pid << 24) | pid
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, 1, 0, NULL)",
                (s + 100, s + 200, gtid, corr),
            )
            con.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 1, 7, ?, ?, 2, 2)",
                (s + 300, min(e, s + 900), corr, pid << 24),
            )
    con.execute(
        "INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (1, 'Local (CLI)', 'DeviceEnvironment', 610, ?)",
        (environment,),
    )
    con.commit()
    con.close()
    return path


ENV = "HOME=/root;RANK=3;LOCAL_RANK=3;WORLD_SIZE=8;NODE_RANK=0;NRL_NSYS_PROFILE_STEP_RANGE=3:5"


def test_nemo_rl_report_name_says_worker_steps_and_pid_but_no_rank():
    name = "megatron_policy_worker_3:5_4242.nsys-rep"
    assert rank_from_name(name) is None  # neither the step range nor the pid is a rank
    assert report_name(name) == {
        "framework": "nemo_rl",
        "worker": "megatron_policy_worker",
        "profiled_steps": [3, 4],
        "pid": 4242,
    }
    assert report_name("vllm_tp_worker_2:3_55.sqlite")["worker"] == "vllm_tp_worker"
    assert report_name("actor_host1_worker_process_4242.2.nsys-rep") == {
        "framework": "ray",
        "pid": 4242,
        "capture_range": 2,
    }
    assert report_name("rank-0.json.gz") == {}
    verl = "actor_train_step7_rank5-of-16_tp1-pp0-dp2-cp0_pid4242_20261208010101001_mb3-4.json.gz"
    assert report_name(verl) == {
        "framework": "verl",
        "profiled_steps": [7],
        "window": "update mini-batches 3-4",
    }
    assert report_name(verl.replace("_mb3-4", "")) == {"framework": "verl", "profiled_steps": [7]}
    assert report_name(verl.replace("_mb3-4", "_part1"))["window"] == "part 1"
    assert rank_from_name(verl) == 5
    # a step number no run reaches is not a profiled step (a range of 10^20 steps would never be built)
    assert "profiled_steps" not in report_name("policy_worker_3:100000000000000000000_42.sqlite")
    assert report_name("actor_train_step99999999999999999999_rank0_pid1.json.gz") == {}


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank-3.json.gz", 3),
        ("trace_rank3.json", 3),
        ("prof_rank-0.json.gz", 0),  # verl <= 0.7 torch profiler
        ("actor_train_step3_rank12-of-16_tp0-pp0-dp3_pid77_20260822101500123.json.gz", 12),  # verl now
        ("frank2.json", None),
    ],
)
def test_rank_from_trace_file_names(name, rank):
    assert rank_from_name(name) == rank


def test_rank_variable_is_read_from_an_environment_string():
    assert rank_from_environment("A=1;RANK=7;LOCAL_RANK=3") == 7
    assert rank_from_environment("LOCAL_RANK=3;NODE_RANK=1;MY_RANK=2") is None
    assert rank_from_environment(None) is None


def test_nemo_rl_worker_export_gets_its_rank_and_worker_phases(tmp_path):
    path = _export(tmp_path / "megatron_policy_worker_3:5_4242.sqlite", ENV)
    tr = load_nsys_events(path)
    assert tr.rank == 3
    assert tr.meta["rank_source"] == "environment RANK"
    assert tr.meta["report_name"]["profiled_steps"] == [3, 4]
    ranges = attribution.attribute_ranges(tr)
    assert dict(zip(ranges["name"], ranges["phase"], strict=True)) == PHASES
    assert (ranges["window_ops"] >= 1).all()


def test_rank_in_environment_is_not_used_for_a_report_of_several_gpu_processes(tmp_path):
    path = _export(tmp_path / "torchrun.sqlite", ENV, pids=(PID, PID + 1))
    tr = load_nsys_events(path, rank=None)
    assert tr.rank is None
    assert "2 processes ran GPU work" in tr.meta["rank_note"]


def test_ingest_of_nemo_rl_worker_export_reports_rank_and_phases(tmp_path, capsys):
    path = _export(tmp_path / "megatron_policy_worker_3:5_4242.sqlite", ENV)
    out = tmp_path / "out"
    assert main(["ingest", str(path), "-o", str(out), "--json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [d["rank"] for d in doc["traces"][0]["devices"]] == [3]
    ranges = store.read_table(out / store.RANGES)
    assert set(ranges["rank"]) == {3}
    assert dict(zip(ranges["name"], ranges["phase"], strict=True)) == PHASES
