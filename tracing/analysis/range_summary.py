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

from collections.abc import Sequence

import numpy as np

from tracing.analysis import mbregions, steps


class Needed:
    """Which rows of a range table the other tables read (see the module docstring), marked as the ranges come
    in table order a block at a time (``range_file.RangeFile.build``): per distinct name (a slot, added with
    :meth:`add_names`) three bytes, per process whether its first range and first user range came; the
    ancestors of the ranges :meth:`block` flags are marked by the nesting pass (``attribution.Nesting``)."""

    def __init__(self, pattern: str | None, domains: Sequence[str]) -> None:
        self.pattern = pattern
        self.user_domain = np.array([mbregions.is_user_domain(d) for d in domains], bool).reshape(-1)
        self.by_name = np.zeros(0, bool)  # an explicit micro-batch or step range, or one of a named phase
        self.library = np.zeros(0, bool)  # an emit_nvtx op or NCCL range
        self.in_set = np.zeros(0, bool)  # a range of a micro-batch phase
        self._first: set[int] = set()
        self._first_user: set[int] = set()

    def add_names(self, names: Sequence[str], phases: Sequence[str]) -> None:
        """Flags for the names (base names) and phases of slots added since the last call."""
        explicit, library, _ = mbregions.name_flags(names, self.pattern)
        step = np.fromiter(map(steps.is_step_name, names), bool, len(names))  # ProfilerStep#N too
        named = np.fromiter((v != "other" for v in phases), bool, len(phases))
        in_set = np.fromiter((v in mbregions.MICROBATCH_PHASES for v in phases), bool, len(phases))
        self.by_name = np.append(self.by_name, explicit | step | named)
        self.library = np.append(self.library, library)
        self.in_set = np.append(self.in_set, in_set)

    def block(self, slot: np.ndarray, domain: np.ndarray, pid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The next block of ranges (name slots, domain codes into ``domains``, pids): which are needed for
        themselves, and which have their ancestors needed."""
        keep = self.by_name[slot]
        user = ~self.library[slot] & self.user_domain[domain]
        for seen, rows in ((self._first, np.arange(len(pid))), (self._first_user, np.flatnonzero(user))):
            p, k = np.unique(pid[rows], return_index=True)
            for q, r in zip(p.tolist(), rows[k].tolist(), strict=True):
                if q not in seen:
                    seen.add(q)
                    keep[r] = True
        return keep, self.in_set[slot]
