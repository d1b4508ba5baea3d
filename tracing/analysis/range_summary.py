"""The rows of a range table that the other tables read: all a streamed file keeps once its ranges are on disk.

An NVTX-heavy export has a range per op (millions), and its range table leaves a streamed worker a part at a
time (``tracing.streamed``, ``tracing.staged``). What reads ranges after that reads these rows only, and gets
from them what it gets from the whole table:

- every range of a named phase (not ``other``): phase regions and samplers (``mbregions.find_regions``), the
  step table's phases (``steps.step_rows``), seconds per phase (``staged.phase_seconds``);
- explicit micro-batch ranges (``--microbatch-range``, else ``mbregions.EXPLICIT_NAMES``), ``ProfilerStep#N``
  and other step ranges (``steps.is_step_name``);
- per process, its first range and its first user range (neither an ``emit_nvtx`` op nor an NCCL range): which
  processes have ranges at all, and which have op ranges only (cut as a whole);
- every ancestor of a range of a micro-batch phase (a phase range nested in another is not a region).

``tests/unit/test_range_summary.py`` checks the micro-batch jobs, step table and phase seconds from these rows
against the whole table's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tracing.analysis import mbregions, steps
from tracing.analysis.attribution import Coded

_BLOCK = 1 << 16  # ranges a step of _firsts


def needed_rows(cols: dict[str, Any], pattern: str | None) -> np.ndarray:
    """The rows (a mask) of the range table made from ``cols`` (``attribution.range_columns``) that micro-batch
    detection, the step table and the phase seconds read (see the module docstring)."""
    name, phase, domain = cols["name"], cols["phase"], cols["domain"]
    assert isinstance(name, Coded) and isinstance(phase, Coded) and isinstance(domain, Coded)
    pid, parent = np.asarray(cols["pid"], np.int64), np.asarray(cols["parent_id"])  # int32 or int64 ids
    n = len(pid)
    explicit, library, _ = mbregions.name_flags(name.values, pattern)
    # per distinct value, a byte (not a Python object: an emit_nvtx export has a distinct name per range)
    step_name = np.fromiter(
        map(steps.is_step_name, name.values), bool, len(name.values)
    )  # ProfilerStep#N too
    named_phase = np.fromiter((v != "other" for v in phase.values), bool, len(phase.values))
    in_set = np.fromiter((v in mbregions.MICROBATCH_PHASES for v in phase.values), bool, len(phase.values))
    user_domain = np.array([mbregions.is_user_domain(d) for d in domain.values], bool).reshape(-1)
    by_name = explicit | step_name
    keep = by_name[name.codes] | named_phase[phase.codes]
    user = ~library[name.codes] & user_domain[domain.codes]
    keep[_firsts(pid, None)] = True
    keep[_firsts(pid, user)] = True
    level = np.flatnonzero(in_set[phase.codes])
    walked = np.zeros(n, bool)  # an ancestor reached before: its own chain is walked already
    while len(level):  # up the parent chains, a generation at a time
        level = np.unique(parent[level])
        level = level[level >= 0]
        level = level[~walked[level]]
        walked[level] = True
    return keep | walked


def _firsts(pid: np.ndarray, where: np.ndarray | None) -> np.ndarray:
    """Per process, the first row where ``where`` holds (every row: None), a block of rows at a time (nothing
    made per range: an emit_nvtx export has millions)."""
    first: dict[int, int] = {}
    for a in range(0, len(pid), _BLOCK):
        b = min(a + _BLOCK, len(pid))
        rows = a + (np.arange(b - a) if where is None else np.flatnonzero(where[a:b]))
        p, k = np.unique(pid[rows], return_index=True)
        for q, r in zip(p.tolist(), rows[k].tolist(), strict=True):
            first.setdefault(q, r)
    return np.array(sorted(first.values()), np.int64)
