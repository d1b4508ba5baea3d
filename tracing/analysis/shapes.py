"""Op names and input shapes -> what a micro-batch processed: its tokens, and the model it ran.

Shapes come from the event table's ``shapes`` column (Kineto ``Input Dims`` with ``record_shapes=True``;
nsys ``emit_nvtx(record_shapes=True)``'s ``sizes = [...]``), one JSON list per op with one entry per
argument (``[]`` for a non-tensor)::

    aten::embedding(weight [V, H], indices [B, S] or packed [1, T], ...)   tokens = B*S (or T)
    aten::linear(input [..., K], weight [N, K], bias)                      tokens = prod(input[:-1])
    aten::addmm(bias, input [M, K], weight [K, N])  aten::mm(input [M, K], weight)   tokens = M

The token count is what the GPU processed: padded tokens for a padded batch, the packed length for
remove-padding (verl ``use_remove_padding``, NeMo RL sequence packing, Megatron THD).
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache

# emit_nvtx appends ", seq = N", ", op_id = N", ", sizes = [...]", ", input_op_ids = [...]" to the op name.
_NVTX_SUFFIXES = (", seq = ", ", op_id = ", ", sizes = ", ", input_op_ids = ")
_NVTX_SUFFIX = re.compile("|".join(map(re.escape, _NVTX_SUFFIXES)))

EMBEDDING_OPS = frozenset({"aten::embedding"})
# op name -> index of the argument whose leading dimensions are the tokens
GEMM_OPS: dict[str, int] = {"aten::linear": 0, "aten::matmul": 0, "aten::mm": 0, "aten::addmm": 1}


def base_op_name(name: str) -> str:
    """The op name without emit_nvtx's suffixes: ``"aten::mm, seq = 3, op_id = 9"`` -> ``"aten::mm"``.

    Not cached: emit_nvtx names are all distinct (``op_id``), and a cache of them costs more than the search."""
    m = _NVTX_SUFFIX.search(name)  # the leftmost of any suffix
    return name if m is None else name[: m.start()]


@lru_cache(maxsize=65536)
def parse_shapes(text: str) -> tuple[tuple[int, ...], ...] | None:
    """``"[[4,512],[32000,4096],[]]"`` -> ((4, 512), (32000, 4096), ()); None when absent or not shapes.

    A list-valued argument that ``record_shapes`` flattened (``[[a, b], [c]]`` inside one entry) or any
    non-integer entry makes that argument ``()``: unknown, never guessed.
    """
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list):
        return None
    out = []
    for arg in value:
        ok = isinstance(arg, list) and all(type(d) is int and d >= 0 for d in arg)
        out.append(tuple(arg) if ok else ())
    return tuple(out)


def embedding_tokens(shapes: tuple[tuple[int, ...], ...] | None) -> int | None:
    """Tokens looked up by ``aten::embedding``: the product of the indices' shape (argument 1)."""
    if shapes is None or len(shapes) < 2 or not shapes[1]:
        return None
    return math.prod(shapes[1])


def embedding_table(shapes: tuple[tuple[int, ...], ...] | None) -> tuple[int, int] | None:
    """(vocab, hidden) of an ``aten::embedding`` weight (argument 0), or None."""
    if shapes is None or not shapes or len(shapes[0]) != 2:
        return None
    vocab, hidden = shapes[0]
    return vocab, hidden


def gemm_tokens(op: str, shapes: tuple[tuple[int, ...], ...] | None) -> int | None:
    """Rows (M) of a GEMM op's activation input: the product of all but its last dimension."""
    arg = GEMM_OPS.get(op)
    if arg is None or shapes is None or len(shapes) <= arg or len(shapes[arg]) < 2:
        return None
    return math.prod(shapes[arg][:-1])


def model_fingerprint(vocab: int, hidden: int) -> str:
    """A model id read from the trace when no ``--label model=`` names it: its embedding table's shape.

    The same model traced at two precisions gets the same id; two different models rarely share one.
    """
    return f"unlabelled-v{vocab}-h{hidden}"
