"""The notebook facade over every stage: ``mxperf.open(path)`` -> everything ``tracing.open`` gives, plus the
kernel summary and the B - A diff, computed by the functions ``mxperf kernels`` and ``mxperf diff`` call.

    t = mxperf.open("runs/ing-mxfp8")            # an ``mxperf ingest`` folder (or a trace file: tables only)
    t.devices(); t.kernels(); t.microbatches()   # tracing.open's tables, unchanged
    t.kernel_summary()                           # the --parquet table of ``mxperf kernels`` (a DataFrame)
    mxperf.open("runs/ing-bf16").diff(t)         # the ``mxperf diff A B --json`` document (a dict)

It lives here, on the top floor, because ``tracing`` may not import ``perfmodel`` (docs/architecture.md);
``tracing.open`` stays the tracing-only entry point. ``kernels()`` keeps its meaning (``kernels.parquet``: a
row per trace, device and kernel name); the summary per kernel name and class is ``kernel_summary()``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tracing.facade import TraceTables
from tracing.outputs.errors import InputError
from tracing.outputs.labels import Labels


@dataclass
class Tables(TraceTables):
    """:class:`tracing.facade.TraceTables` plus the kernel summary and the diff (an ingest folder's)."""

    def _ingest(self, what: str) -> Path:
        if not self.is_folder:
            raise InputError(
                f"{self.path}: {what} reads an `mxperf ingest` folder; run mxperf ingest {self.path} -o DIR "
                "and mxperf.open(DIR)"
            )
        return self.path

    def kernel_summary(self, top: int = 0) -> pd.DataFrame:
        """The ``mxperf kernels --parquet`` table (a row per kernel class and per kernel, the ``top`` longest;
        0 = all; columns in docs/contracts.md); ``.attrs`` holds ``busy_ns``, ``ops``, ``op_ns`` and the
        micro-batches per phase."""
        from perfmodel.kernels.summary import summarize
        from perfmodel.kernels.tables import META_KEYS, summary_table

        if top < 0:
            raise InputError(f"top={top}: must be >= 0 (0 gives every kernel)")
        doc = summarize(self._ingest("kernel_summary()"), top=top)
        df = summary_table(doc).to_pandas()
        df.attrs.update({k: doc[k] for k in META_KEYS})
        return df

    def diff(
        self, other: TraceTables | str | os.PathLike[str], *, on: str | None = None, device: str | None = None
    ) -> dict[str, Any]:
        """``other`` minus this ingest (this one is A, the baseline): the ``mxperf diff A B --json`` document
        (``by_size``, ``by_phase``, ``by_step``, ``only_a``, ``only_b``); with ``on``, its ``what_if`` on that
        device (``device``: the traces' own, when their ``gpu_names`` do not say)."""
        from perfmodel.breakeven.whatif import diff_document
        from perfmodel.kernels.devices import device as named

        a = self._ingest("diff()")
        b = other.path if isinstance(other, TraceTables) else Path(other)
        if not b.exists():
            raise InputError(f"{b}: no such file or folder")
        if device is not None and on is None:
            raise InputError("device= names the traces' device for on=; give on= too")
        dst = named(on) if on is not None else None
        return diff_document(a, b, dst, named(device) if device else None)


def open(
    path: str | os.PathLike[str], *, labels: Labels | None = None, phase_map: str | None = None
) -> Tables:
    """A trace file or an ``mxperf ingest`` folder, as :func:`tracing.open`; the kernel summary and the diff
    need the folder."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or folder")
    return Tables(path=p, labels=labels or Labels(), phase_map=phase_map)
