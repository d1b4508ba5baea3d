"""Where micro-batches are looked for in a trace: detection regions and explicit micro-batch ranges.

The rules are docs/tracing.md's ("Micro-batches", **Where**). NeMo RL's ``*/train_microbatch*`` names come from
``nemo_rl/models/policy/workers/megatron_policy_worker.py`` and ``nemo_rl/data_plane/worker_mixin.py``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tracing.analysis.mbsignals import Signals
from tracing.outputs import schema

if TYPE_CHECKING:
    import pyarrow as pa

MICROBATCH_PHASES: tuple[str, ...] = ("update", "logprob", "reward")
EXPLICIT_NAMES = re.compile(
    r"^(?:update/microbatch|micro_batch\d+|(?:[\w.\-]+/)?train_microbatch(?:_presharded)?)$"
)
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_LIBRARY = re.compile(r", op_id = |, seq = |^nccl")  # emit_nvtx op ranges, NCCL's own NVTX ranges


@dataclass(frozen=True)
class Region:
    pid: int
    tid: int
    phase: str | None
    start_ns: int
    end_ns: int
    step: int
    name: str


def find_regions(ranges: pa.Table, pattern: str | None) -> tuple[list[Region], pa.Table, list[int]]:
    """Detection regions, explicit micro-batch ranges, and the processes to cut as a whole (ranges only
    from ``emit_nvtx``), from a range table (``attribution.range_frame``).

    Names are matched once per distinct name; only candidate rows are walked (emit_nvtx traces hold one
    range per op)."""
    if ranges.num_rows == 0:
        return [], ranges, []
    codes, uniq = _factorized(ranges, "name")
    explicit, library, is_step = (flags[codes] for flags in name_flags(uniq, pattern))
    phase_codes, phases = _factorized(ranges, "phase")
    pid = ranges.column("pid").to_numpy().astype(np.int64)
    in_set = np.isin(phases, MICROBATCH_PHASES)[phase_codes] & ~explicit
    regions: list[Region] = []
    fallback: list[int] = []
    tid, start, end = (ranges.column(c).to_numpy().astype(np.int64) for c in ("tid", "start_ns", "end_ns"))

    def region(k: int, phase: str | None) -> Region:
        return Region(int(pid[k]), int(tid[k]), phase, int(start[k]), int(end[k]), -1, str(uniq[codes[k]]))

    candidates = np.flatnonzero(in_set)
    if len(candidates):
        rid = ranges.column("range_id").to_numpy().astype(np.int64)
        parent = dict(zip(rid.tolist(), ranges.column("parent_id").to_pylist(), strict=True))
        flagged = set(rid[in_set].tolist())
        for k in candidates.tolist():
            if not _has_flagged_ancestor(int(rid[k]), parent, flagged):
                regions.append(region(k, str(phases[phase_codes[k]])))
    covered = {r.pid for r in regions}
    # user ranges: not emit_nvtx op ranges, not NCCL's own NVTX ranges (ncclSend, ncclGroupStart, ...)
    dom_codes, domains = _factorized(ranges, "domain")
    user = ~library & np.array([is_user_domain(d) for d in domains], bool)[dom_codes]
    not_trained = np.isin(phases, ("generate", "sync"))[phase_codes]
    for p in sorted(set(pid.tolist()) - covered):
        mine = pid == p
        if not_trained[mine].any() or explicit[mine].any():
            continue  # a sampler / sync process, or one marked with explicit ranges: no fallback
        steps = np.flatnonzero(mine & is_step)
        if len(steps):
            regions += [region(k, None) for k in steps.tolist()]
        elif not (mine & user).any():
            fallback.append(int(p))  # only op ranges: cut the process as a whole
    return regions, schema.rows_where(ranges, explicit), fallback


def name_flags(names: Sequence[str], pattern: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct range name: an explicit micro-batch range (``pattern``, else :data:`EXPLICIT_NAMES`), a
    library range (emit_nvtx op, NCCL), a ``ProfilerStep#N``. Three bytes a name, nothing else per name (an
    emit_nvtx export has a distinct name per range)."""
    explicit_rx = re.compile(pattern) if pattern else EXPLICIT_NAMES
    per_name = np.fromiter(
        (
            flag
            for n in names
            for flag in (
                explicit_rx.fullmatch(n) is not None,
                _LIBRARY.search(n) is not None,
                _PROFILER_STEP.fullmatch(n) is not None,
            )
        ),
        bool,
        3 * len(names),
    ).reshape(len(names), 3)
    return per_name[:, 0], per_name[:, 1], per_name[:, 2]


def is_user_domain(domain: str) -> bool:
    """A range domain of the user's (not NCCL's own NVTX domain)."""
    return domain.upper() != "NCCL"


def _factorized(ranges: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray]:
    """Codes and distinct values (as ``str``; a null as pandas writes it, ``<NA>``) of a string column,
    without a Python string per row (an nsys export holds a range per op)."""
    codes, uniq = schema.factorize(ranges, column)
    return codes, np.array(["<NA>" if u is None else str(u) for u in uniq], dtype=object)


def _has_flagged_ancestor(rid: int, parent: dict[int, int], flagged: set[int]) -> bool:
    p = parent.get(rid, -1)
    while p is not None and p >= 0:
        if p in flagged:
            return True
        p = parent.get(p, -1)
    return False


def whole_process_region(sig: Signals, pid: int) -> Region | None:
    """The fallback region of a process with no ranges at all: its host span, on its busiest thread."""
    p = sig.processes.get(pid)
    whole = p.whole() if p is not None else None
    if whole is None:
        return None
    tid, first, last = whole
    return Region(pid, tid, None, first, last, -1, "")
