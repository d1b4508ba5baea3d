"""The range helper: the one place that emits range names (step, generate, update/microbatch, ...).

Each range goes to a host-side **range log** (``time.monotonic_ns``, thread, depth, parent, attributes; it
becomes ``ranges.parquet``), and also to **NVTX** when CUDA is present and to **torch.profiler**
(``record_function``) when a profiler is active. Attributes go into the NVTX / profiler name as
``name[k=v,...]`` only with ``encode_attrs``. About a microsecond a range on CPU (benchmarks/bench_ranges.py).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tracing.outputs.schema import RANGE_LOG_COLUMNS


@dataclass(frozen=True)
class RangeRecord:
    range_id: int
    name: str
    start_ns: int
    end_ns: int
    tid: int
    depth: int
    parent_id: int | None
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


def _torch_sinks() -> tuple[Any, Any]:
    """(nvtx module or None, record_function or None) -- only if torch is already imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, None
    nvtx = torch.cuda.nvtx if torch.cuda.is_available() else None
    return nvtx, torch.profiler.record_function


class RangeLog:
    """Collects ranges; thread-safe; ``to_frame()`` gives the ``ranges.parquet`` table."""

    def __init__(self, *, emit_nvtx: bool = True, emit_profiler: bool = True, encode_attrs: bool = False):
        self._records: list[RangeRecord] = []
        self._ids = itertools.count()
        self._local = threading.local()
        self._lock = threading.Lock()
        self.emit_nvtx = emit_nvtx
        self.emit_profiler = emit_profiler
        self.encode_attrs = encode_attrs

    def _stack(self) -> list[int]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    @contextlib.contextmanager
    def range(self, name: str, **attrs: Any) -> Iterator[dict[str, Any]]:
        """Time a block. Yields the attribute dict: values added inside the block are recorded too."""
        nvtx, record_function = _torch_sinks() if (self.emit_nvtx or self.emit_profiler) else (None, None)
        label = name
        if self.encode_attrs and attrs:
            label = f"{name}[{','.join(f'{k}={v}' for k, v in attrs.items())}]"
        stack = self._stack()
        range_id = next(self._ids)
        parent = stack[-1] if stack else None
        depth = len(stack)
        stack.append(range_id)
        rf_cm = None
        if record_function is not None and self.emit_profiler:
            torch = sys.modules["torch"]
            if torch.autograd.profiler._is_profiler_enabled:
                rf_cm = record_function(label)
                rf_cm.__enter__()
        if nvtx is not None and self.emit_nvtx:
            nvtx.range_push(label)
        live = dict(attrs)
        start = time.monotonic_ns()
        try:
            yield live
        finally:
            end = time.monotonic_ns()
            if nvtx is not None and self.emit_nvtx:
                nvtx.range_pop()
            if rf_cm is not None:
                rf_cm.__exit__(None, None, None)
            stack.pop()
            rec = RangeRecord(range_id, name, start, end, threading.get_ident(), depth, parent, live)
            with self._lock:
                self._records.append(rec)

    @property
    def records(self) -> list[RangeRecord]:
        with self._lock:
            return sorted(self._records, key=lambda r: (r.start_ns, r.range_id))

    def to_frame(self) -> Any:
        """The range log as a DataFrame (columns in ``RANGE_LOG_COLUMNS``; attrs as JSON text)."""
        import pandas as pd

        rows = [
            {
                "range_id": r.range_id,
                "name": r.name,
                "start_ns": r.start_ns,
                "end_ns": r.end_ns,
                "dur_ns": r.dur_ns,
                "tid": r.tid,
                "depth": r.depth,
                "parent_id": r.parent_id if r.parent_id is not None else -1,
                "attrs": json.dumps(r.attrs, sort_keys=True, default=str),
            }
            for r in self.records
        ]
        return pd.DataFrame(rows, columns=list(RANGE_LOG_COLUMNS)).astype(RANGE_LOG_COLUMNS)
