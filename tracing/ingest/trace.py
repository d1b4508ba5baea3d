"""The in-memory result of ingesting one trace file: its event table plus what the file says about itself."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing.outputs import schema

if TYPE_CHECKING:
    import pandas as pd

# "rank-3", "rank3", "prof_rank-0", verl's "actor_update_step3_rank0-of-8_tp0-pp0-dp0_pid..." -- not "frank2".
_RANK_IN_NAME = re.compile(r"(?<![a-z])rank[-_]?(\d+)", re.IGNORECASE)
# NeMo RL's '<worker>_<NRL_NSYS_PROFILE_STEP_RANGE>_%p' (nemo_rl/distributed/worker_group_utils.py
# get_nsight_config_if_pattern_matches): worker class, profiled steps [start, stop), pid -- no rank.
_NEMO_RL_REPORT = re.compile(r"^(?P<worker>[A-Za-z]\w*?)_(?P<start>\d+)[:-](?P<stop>\d+)_(?P<pid>\d+)$")
# Ray's default nsight output (verl): [<role>_<host>_]worker_process_<pid>[.<capture range id>].
_RAY_REPORT = re.compile(r"worker_process_(?P<pid>\d+)(?:\.(?P<capture>\d+))?$")
# verl's torch profiler: '<worker>_<role>_step<N>_rank<r>-of-<w>_..._pid<p>_<timestamp>'
# (verl/utils/profiler/torch_profile.py build_trace_basename)
_VERL_STEP = re.compile(r"(?:^|_)step(?P<step>\d+)_rank\d+")
# ... and a file that holds a window of the step (a torch.profiler schedule): '_mb<first>[-<last>]' (update
# mini-batches), '_part<k>' (a later window of the step)
_VERL_WINDOW = re.compile(r"_(?:mb(?P<first>\d+)(?:-(?P<last>\d+))?|part(?P<part>\d+))$")
MAX_RANK = 2**31 - 1  # the largest rank a name, an environment, a file or --rank may give
MAX_STEP = 10**7  # a step number a name may give (larger: not a profiled step; ten digits and more overflow)
_REPORT_SUFFIXES = (".nsys-rep", ".qdrep", ".sqlite", ".sqlite3", ".db", ".gz", ".json")
# the global rank torchrun and Ray worker groups set (verl/single_controller/ray/base.py,
# nemo_rl/distributed/worker_groups.py)
_RANK_VARIABLE = re.compile(r"(?:^|;)RANK=(\d+)(?:;|$)")


@dataclass
class Trace:
    """One ingested file. ``events`` follows ``schema.EVENT_COLUMNS``; ``meta`` is JSON-able.

    ``events`` and ``range_log`` are pandas frames from the public loaders (``tracing.load_trace``), Arrow
    tables inside ``mxperf ingest`` (``rangelog.read_range_log``); ``of_kind`` / ``num_gpu_ops`` need a frame."""

    path: str
    format: str  # kineto | nsys | rangelog
    events: Any  # pd.DataFrame | pa.Table
    rank: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    range_log: Any = None  # mxperf range log (format "rangelog" only): pd.DataFrame | pa.Table

    def of_kind(self, *kinds: str) -> pd.DataFrame:
        return self.events[self.events["kind"].isin(kinds)]

    @property
    def num_gpu_ops(self) -> int:
        return int(self.events["kind"].isin(schema.GPU_OP_KINDS).sum())


def zero_negative(dur: np.ndarray) -> int:
    """Set ``dur``'s negative durations to 0, in place (a profiler bug: an end before the start, e.g.
    pytorch/kineto#646); how many there were, for the trace's meta and the ingest summary."""
    negative = dur < 0
    count = int(negative.sum())
    if count:
        dur[negative] = 0
    return count


def trace_warnings(meta: dict[str, Any]) -> list[str]:
    """What a file's meta says its GPU numbers may miss (the ingest summary and each manifest entry's
    ``warnings``): durations a profiler bug made negative, GPU and host clocks that disagree, CUDA graphs traced
    whole."""
    out = []
    if meta.get("negative_durations"):
        out.append(
            f"{meta['negative_durations']} events have a negative duration (a profiler bug, e.g. "
            "pytorch/kineto#646); each is taken as 0 long, so busy time may be short of the truth"
        )
    if before := meta.get("ops_before_launch"):
        out.append(
            f"{before['ops']} of {before['launched_ops']} GPU ops start before their launch call started (up to "
            f"{before['max_lead_ns'] / 1e3:.1f} us earlier): the trace's GPU and host clocks disagree, so host "
            "stall, which compares them, may be off by up to that much per gap"
        )
    if meta.get("cuda_graphs_whole"):
        out.append(
            f"{meta['cuda_graphs_whole']} CUDA graph launches were traced whole (nsys --cuda-graph-trace=graph, "
            "its default): each is one op 'CUDA graph <id>' from its start to its end, so busy time includes "
            "any gaps between its nodes and the kernel table and precision evidence do not see its kernels; "
            "profile with --cuda-graph-trace=node for them"
        )
    if meta.get("cuda_graphs_untimed"):
        out.append(
            f"{meta['cuda_graphs_untimed']} CUDA graph launches have no timestamps (CUPTI could not time them) "
            "and are left out: busy time is short of the truth"
        )
    return out


def rank_from_name(path: str | Path) -> int | None:
    """``rank-3.json.gz`` / ``trace_rank3.json`` / verl's ``..._rank3-of-8_...`` -> 3; None when the name
    carries no rank."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m and int(m.group(1)) <= MAX_RANK else None


def report_name(path: str | Path) -> dict[str, Any]:
    """What a framework's profiler file name says besides a rank, or {} when it follows no known pattern.

    NeMo RL ``megatron_policy_worker_3:5_12345.nsys-rep`` -> ``{"framework": "nemo_rl", "worker":
    "megatron_policy_worker", "profiled_steps": [3, 4], "pid": 12345}``; Ray / verl
    ``worker_process_12345.2.nsys-rep`` -> ``{"framework": "ray", "pid": 12345, "capture_range": 2}``; verl's
    torch profiler ``actor_train_step7_rank0-of-8_..._pid12345_<timestamp>.json.gz`` -> ``{"framework": "verl",
    "profiled_steps": [7]}``, and with ``_mb2-3`` (a torch.profiler schedule's window of update mini-batches) or
    ``_part1`` at its end ``"window": "update mini-batches 2-3"`` / ``"part 1"``.
    """
    stem = Path(path).name
    while stem.endswith(_REPORT_SUFFIXES):
        stem = stem[: stem.rfind(".")]
    m = _NEMO_RL_REPORT.match(stem)
    if m and 1 <= int(m["start"]) < int(m["stop"]) <= MAX_STEP:
        steps = list(range(int(m["start"]), int(m["stop"])))
        return {"framework": "nemo_rl", "worker": m["worker"], "profiled_steps": steps, "pid": int(m["pid"])}
    m = _RAY_REPORT.search(stem)
    if m:
        info: dict[str, Any] = {"framework": "ray", "pid": int(m["pid"])}
        if m["capture"] is not None:
            info["capture_range"] = int(m["capture"])
        return info
    m = _VERL_STEP.search(stem)
    if m and int(m["step"]) <= MAX_STEP:
        info = {"framework": "verl", "profiled_steps": [int(m["step"])]}
        w = _VERL_WINDOW.search(stem)
        if w:  # a window of the step only: its phases are partial
            info["window"] = (
                f"update mini-batches {w['first']}-{w['last'] or w['first']}"
                if w["first"]
                else f"part {w['part']}"
            )
        return info
    return {}


def rank_from_environment(environment: str | None) -> int | None:
    """``RANK`` in a process environment written as ``K=V;K=V`` (nsys ``TARGET_INFO_SYSTEM_ENV``
    ``DeviceEnvironment``); None without one."""
    m = _RANK_VARIABLE.search(environment or "")
    return int(m.group(1)) if m and int(m.group(1)) <= MAX_RANK else None


def report_rank(
    path: str | Path, rank: int | None, environment: str | None, num_gpu_pids: int
) -> tuple[int | None, dict[str, Any]]:
    """Rank of a one-process report (nsys) and how it was found, as ``(rank, meta)``.

    The environment's ``RANK`` wins over ``rank`` (file name or ``--rank``) when at most one process ran GPU
    ops (``num_gpu_pids``); otherwise ``rank`` stands and the meta says why. The meta carries :func:`report_name`.
    """
    meta: dict[str, Any] = {}
    named = report_name(path)
    if named:
        meta["report_name"] = named
    env_rank = rank_from_environment(environment)
    if env_rank is not None and num_gpu_pids <= 1:
        meta["rank_source"] = "environment RANK"
        return env_rank, meta
    if env_rank is not None:
        meta["rank_note"] = (
            f"RANK={env_rank} in the profiler's environment, but {num_gpu_pids} processes ran GPU work: not used"
        )
    meta["rank_source"] = None if rank is None else "file name or --rank"
    return rank, meta


def events_frame(
    columns: dict[str, Any],
    names: list[str],
    kinds: list[str],
    domains: list[str],
    shapes: list[str] | None = None,
) -> pd.DataFrame:
    """Build the event table from int64 arrays and category codes (``name``/``kind``/``domain`` are codes).

    ``shapes`` are the categories of the ``shapes`` codes (code 0 must be ""); without it every row is "".
    """
    import pandas as pd

    zeros = np.zeros(len(columns["name"]), np.int32)
    shape_codes = columns.get("shapes") if shapes is not None else None
    categories = {
        "name": (columns["name"], names),
        "kind": (columns["kind"], kinds),
        "domain": (columns.get("domain", zeros), domains),
        "shapes": (zeros if shape_codes is None else np.maximum(shape_codes, 0), shapes or [""]),
    }
    data = {
        col: pd.Categorical.from_codes(np.asarray(codes, np.int32), categories=cats)
        for col, (codes, cats) in categories.items()
    }
    data.update({c: np.asarray(columns[c], np.int64) for c in schema.EVENT_COLUMNS if c not in categories})
    return pd.DataFrame({c: data[c] for c in schema.EVENT_COLUMNS}, copy=False)
