"""The host-side signals micro-batch detection reads: per-name flags, and per-process arrays of a slab of items.

For each process: its host items (Kineto ``cpu_op`` and launch calls; nsys launch calls and
``emit_nvtx`` op ranges) and its GPU launches (GPU ops joined to their launch call), each sorted by start
(:mod:`tracing.analysis.mb_engine` reads them from the engine), with per-name flags computed once per distinct name:

- **embedding**: an ``aten::embedding`` op; one into a vocabulary-sized table (``Signals.token_tables``) marks
  a forward pass of a language model;
- **gemm**: a GEMM op with shapes (``aten::linear`` / ``mm`` / ``addmm`` / ``matmul``) or a GEMM kernel;
- **autograd**: the autograd engine's backward ops (``autograd::engine::evaluate_function: ...``,
  ``*Backward0``), which run on the device's autograd thread on a GPU;
- **sync**: a host wait for the device (``cudaStreamSynchronize`` & co., ``aten::_local_scalar_dense`` /
  ``aten::item``: what ``loss.item()`` leaves after each micro-batch);
- **optimizer**: torch.optim's ``Optimizer.step#...`` / ``Optimizer.zero_grad#...`` ranges.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tracing.analysis import shapes

if TYPE_CHECKING:
    from tracing.analysis.mb_engine import EngineItems

_AUTOGRAD = re.compile(r"^autograd::engine::evaluate_function|Backward\d*$")
_SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::item"})
_BLOCKING_COPY = re.compile(r"^(?:cudaMemcpy|cuMemcpyDtoH(?:_v2)?)(?:_v\d+)?$")  # synchronous copies
_OPTIMIZER = re.compile(r"^Optimizer\.(?:step|zero_grad)#")
_CONV = re.compile(r"^aten::\w*conv(?:olution|\d|_transpose)")  # aten::conv2d, cudnn_convolution, ...
_EMIT_NVTX = re.compile(r", (?:seq|op_id) = \d")  # an NVTX range emit_nvtx made for an op

VOCAB_MIN = 64  # rows of the smallest token-embedding table (vocabulary) taken as one
HOST_FIELDS = ("tid", "start", "end", "code", "shape")
LAUNCH_FIELDS = ("l_tid", "l_start", "l_end", "op_start", "op_end", "prev_end", "l_kernel", "l_gemm")


@dataclass
class Process:
    """The signals of one process; every array of a group has one entry per item, sorted by start."""

    pid: int
    # host items
    tid: np.ndarray
    start: np.ndarray
    end: np.ndarray
    code: np.ndarray  # name code into Signals.names
    shape: np.ndarray  # shape code into Signals.shapes
    # launches (GPU ops with a launch record)
    l_tid: np.ndarray
    l_start: np.ndarray  # launch call start
    l_end: np.ndarray  # launch call end
    op_start: np.ndarray  # GPU op start
    op_end: np.ndarray  # GPU op end
    prev_end: np.ndarray  # end of the process's GPU work launched before this launch (-1: none)
    l_kernel: np.ndarray  # a kernel (not a memcpy / memset)
    l_gemm: np.ndarray  # a GEMM kernel
    # optimizer ranges (start, end) of this process
    opt_start: np.ndarray
    opt_end: np.ndarray

    def host_blocks(
        self, lo: int, hi: int, columns: tuple[str, ...], size: int
    ) -> Iterator[dict[str, np.ndarray]]:
        """``columns`` of the host items starting in [lo, hi], ``size`` items at a time (views)."""
        return _blocks(self, start_slice(self.start, lo, hi), columns, size)

    def launch_blocks(
        self, lo: int, hi: int, columns: tuple[str, ...], size: int
    ) -> Iterator[dict[str, np.ndarray]]:
        """``columns`` of the launches whose call starts in [lo, hi], ``size`` at a time (views)."""
        return _blocks(self, start_slice(self.l_start, lo, hi), columns, size)

    def window(self, lo: int, hi: int) -> Process:
        """The host items and launches starting in [lo, hi] (views), with every optimizer range."""
        hs, ls = start_slice(self.start, lo, hi), start_slice(self.l_start, lo, hi)
        host = [getattr(self, c)[hs] for c in HOST_FIELDS]
        return Process(
            self.pid, *host, *(getattr(self, c)[ls] for c in LAUNCH_FIELDS), self.opt_start, self.opt_end
        )


def start_slice(sorted_start: np.ndarray, lo: int, hi: int) -> slice:
    """The items starting in [lo, hi] as a slice: a view of each column, not a copy, and no index per item (a
    region with no ranges to cut it is a whole process, millions of items)."""
    a = int(np.searchsorted(sorted_start, lo, side="left"))
    return slice(a, max(a, int(np.searchsorted(sorted_start, hi, side="right"))))


def _blocks(p: Process, rows: slice, columns: tuple[str, ...], size: int) -> Iterator[dict[str, np.ndarray]]:
    for a in range(rows.start, rows.stop, size):
        blk = slice(a, min(a + size, rows.stop))
        yield {c: getattr(p, c)[blk] for c in columns}


@dataclass
class Signals:
    names: list[str]
    base: list[str]  # name without emit_nvtx suffixes
    is_embedding: np.ndarray  # per name code
    gemm_arg: np.ndarray  # per name code: argument index of a GEMM op's activations, -1 = not a GEMM op
    is_autograd: np.ndarray
    is_sync: np.ndarray
    is_conv: np.ndarray
    shapes: list[str]
    processes: dict[int, EngineItems]

    def tokens_of(self, code: int, shape_code: int) -> int | None:
        """Tokens an embedding or GEMM op processed, from its shapes (None when unknown)."""
        parsed = shapes.parse_shapes(self.shapes[shape_code])
        if self.is_embedding[code]:
            return shapes.embedding_tokens(parsed)
        return shapes.gemm_tokens(self.base[code], parsed)

    def table_of(self, shape_code: int) -> tuple[int, int] | None:
        """(rows, columns) of an embedding lookup's table, None when its shapes are unknown."""
        return shapes.embedding_table(shapes.parse_shapes(self.shapes[shape_code]))

    def token_tables(self, shape_codes: list[int]) -> np.ndarray:
        """Which of a region's embedding lookups (their shape codes) use a token-embedding table: a vocabulary,
        at least twice as many rows as columns, :data:`VOCAB_MIN` rows or more and within 8x of the largest
        table looked up -- not a position or relative-bias table (``[32, heads]``), not a square matrix.
        Lookups of unknown shape count (nothing to tell them by)."""
        tables = [self.table_of(k) for k in shape_codes]
        most = max((t[0] for t in tables if t), default=0)
        return np.array(
            [t is None or (t[0] >= max(VOCAB_MIN, 2 * t[1]) and 8 * t[0] >= most) for t in tables], bool
        )

    def input_rank(self, code: int, shape_code: int) -> int:
        """Dimensions of a GEMM op's activation input (0 when unknown)."""
        parsed = shapes.parse_shapes(self.shapes[shape_code])
        arg = int(self.gemm_arg[code])
        return len(parsed[arg]) if parsed is not None and 0 <= arg < len(parsed) else 0

    def model_of(self, code: int, shape_code: int) -> str | None:
        if not self.is_embedding[code]:
            return None
        table = self.table_of(shape_code)
        return shapes.model_fingerprint(*table) if table else None


def name_signals(names: list[str], shape_cats: list[str]) -> Signals:
    """The per-name flags of a trace's names (its ``name`` categories), with no processes yet: computed per
    distinct op name, and each name's op name one shared string (emit_nvtx names are all distinct, their op
    names few)."""
    shared: dict[str, str] = {}
    base = [shared.setdefault(b, b) for b in map(shapes.base_op_name, names)]
    flags = {
        b: (
            b in shapes.EMBEDDING_OPS,
            shapes.GEMM_OPS.get(b, -1),
            _AUTOGRAD.search(b) is not None,
            b in _SYNC_OPS or "Synchronize" in b or _BLOCKING_COPY.match(b) is not None,
            _CONV.match(b) is not None,
        )
        for b in shared
    }
    per_name = [flags[b] for b in base]
    is_embedding = np.array([f[0] for f in per_name], bool)
    gemm_arg = np.array([f[1] for f in per_name], np.int64)
    is_autograd = np.array([f[2] for f in per_name], bool)
    is_sync = np.array([f[3] for f in per_name], bool)
    is_conv = np.array([f[4] for f in per_name], bool)
    return Signals(names, base, is_embedding, gemm_arg, is_autograd, is_sync, is_conv, shape_cats, {})


def is_op_range(name: str) -> bool:
    """An NVTX range ``emit_nvtx`` made for an op (``"aten::mm, seq = 3, op_id = 9"``): a host item."""
    base = shapes.base_op_name(name)
    return _EMIT_NVTX.search(name) is not None and ("::" in base or _AUTOGRAD.search(base) is not None)


def is_optimizer(name: str) -> bool:
    """torch.optim's ``Optimizer.step#...`` / ``Optimizer.zero_grad#...`` range."""
    return _OPTIMIZER.match(shapes.base_op_name(name)) is not None


def make_process(
    pid: int,
    host: dict[str, np.ndarray],
    lau: dict[str, np.ndarray],
    opt_start: np.ndarray,
    opt_end: np.ndarray,
) -> Process:
    """A :class:`Process` from its host items (``tid start end code shape``, sorted by start),
    its launches (:data:`LAUNCH_FIELDS`, sorted by launch start) and its optimizer ranges (sorted by start)."""
    return Process(
        pid,
        *(host[c] for c in ("tid", "start", "end")),
        np.asarray(host["code"]),  # any int type
        np.maximum(np.asarray(host["shape"]), 0),
        *(lau[c] for c in LAUNCH_FIELDS),
        opt_start,
        opt_end,
    )
