"""GPU op classes by name pattern, so "time spent quantizing" or "time in NCCL" is one number.

Classes: ``communication``, ``attention``, ``gemm``, ``quantize`` (FP8 / MX / FP4 quantize, dequantize,
amax, scale and the transposes of quantized data: the overhead low precision adds), ``elementwise``,
``other``; memcpy and memset ops are classed by their kind.

The rules are the rows of ``kernel_patterns.toml`` (next to this module): real kernel-name patterns
(cuBLAS / cuBLASLt / CUTLASS, Transformer Engine, Triton / Inductor, hipBLASLt / Tensile ``Cijk_*``,
rocBLAS, composable_kernel, vLLM, torchao, PyTorch's own loops), each with the project and file its names
were read from. Rows are tried in file order, first match wins. Matching is token-aware: a row's token
regex must cover whole name tokens (runs of letters and digits, :func:`token_regex`), so ``cast`` is
never found inside ``gpu_kernel_impl_nocast`` or ``LoadWithCast``. GEMM rows also say how to read the
operand precision (``tracing.analysis.precision``). Extend with :func:`with_rules` (your rules, plain
case-insensitive regexes, are tried first).
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing.outputs import schema

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

CLASSES: tuple[str, ...] = (
    "communication",
    "attention",
    "gemm",
    "quantize",
    "elementwise",
    "other",
    "memcpy",
    "memset",
)

PATTERNS_PATH = Path(__file__).with_name("kernel_patterns.toml")

# What a gemm row's ``precision`` may be: a family, or the name of a decoder in tracing.analysis.precision.
PRECISION_FAMILIES: tuple[str, ...] = ("mxfp8", "fp8", "fp4", "bf16", "fp16", "fp32", "fp64", "int8")
PRECISION_DECODERS: tuple[str, ...] = (
    "tensile",
    "nvjet",
    "xmma",
    "cutlass",
    "cublas",
    "deepgemm",
    "operand-types",
)


@dataclass(frozen=True)
class PatternExample:
    """A real kernel name a row was read from (or built from the identifier its source defines)."""

    name: str
    precision: str | None  # expected precision family of a gemm row's example; None = unknown
    source: str  # where the name comes from, when that is not the row's own file
    note: str = ""


@dataclass(frozen=True)
class PatternRow:
    """One row of ``kernel_patterns.toml``."""

    id: str
    kernel_class: str
    tokens: tuple[str, ...]
    precision: str | None  # gemm rows: a family, a decoder name, or None (the names do not say)
    project: str
    file: str
    commit: str
    note: str
    examples: tuple[PatternExample, ...]

    @property
    def regex(self) -> str:
        """The row as one regex (its tokens as alternatives, each bounded by :func:`token_regex`)."""
        return "|".join(token_regex(t) for t in self.tokens)


def token_regex(token: str) -> str:
    """``token`` (a case-insensitive regex over whole name tokens) with its token boundaries.

    The match may not start right after a letter nor end right before a letter or digit; a digit may
    precede it (the length prefixes of mangled names: ``_ZN19cutlass_cudnn_train``). The leading check
    is written after the token's first literal character (``c(?<![a-z]c)ast...``), so every branch of a
    class's combined rule still starts with a literal the regex engine can scan for.
    """
    first, rest = token[0], token[1:]
    return f"{first}(?<![a-z]{first})(?:{rest})(?![a-z0-9])"


def _check_token(row_id: str, token: str) -> None:
    problem = ""
    if not token or not token.isascii() or token != token.lower():
        problem = "must be non-empty ASCII lower case"
    elif not (token[0].isalpha() or token[0] == "_"):
        problem = "must start with a letter or '_'"
    elif token[1:2] in ("*", "+", "?", "{"):
        problem = "may not quantify its first character"
    else:
        depth = 0
        escaped = False
        for ch in token:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif ch == "|" and depth == 0:
                problem = "may not alternate at top level (list the alternatives as tokens)"
                break
        if not problem:
            try:
                re.compile(token_regex(token))
            except re.error as exc:
                problem = f"does not compile ({exc})"
    if problem:
        raise ValueError(f"kernel pattern {row_id!r}: token {token!r} {problem}")


def load_patterns(path: str | Path = PATTERNS_PATH) -> tuple[PatternRow, ...]:
    """The rows of a kernel-pattern table (``kernel_patterns.toml``), checked."""
    data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    rows: list[PatternRow] = []
    seen: set[str] = set()
    for raw in data.get("row", []):
        row_id = str(raw["id"])
        cls = str(raw["class"])
        if row_id in seen:
            raise ValueError(f"kernel pattern {row_id!r}: duplicate id")
        seen.add(row_id)
        if cls not in CLASSES or cls in ("memcpy", "memset", "other"):
            raise ValueError(f"kernel pattern {row_id!r}: class {cls!r} is not a kernel class")
        precision = raw.get("precision")
        if precision is not None and (
            cls != "gemm" or precision not in PRECISION_FAMILIES + PRECISION_DECODERS
        ):
            raise ValueError(
                f"kernel pattern {row_id!r}: precision {precision!r} (gemm rows only: a family or decoder)"
            )
        tokens = tuple(str(t) for t in raw["tokens"])
        for t in tokens:
            _check_token(row_id, t)
        examples = tuple(
            PatternExample(
                name=str(e["name"]),
                precision=e.get("precision"),
                source=str(e.get("from", "")),
                note=str(e.get("note", "")),
            )
            for e in raw.get("example", [])
        )
        if not examples or not raw.get("project") or not raw.get("file"):
            raise ValueError(f"kernel pattern {row_id!r}: needs project, file and at least one example")
        rows.append(
            PatternRow(
                id=row_id,
                kernel_class=cls,
                tokens=tokens,
                precision=precision,
                project=str(raw["project"]),
                file=str(raw["file"]),
                commit=str(raw.get("commit", "")),
                note=str(raw.get("note", "")),
                examples=examples,
            )
        )
    return tuple(rows)


PATTERNS: tuple[PatternRow, ...] = load_patterns()


def _class_rules(rows: Iterable[PatternRow]) -> tuple[tuple[str, str], ...]:
    """(class, regex) per run of consecutive rows of one class: first match wins as row by row."""
    rules: list[tuple[str, list[str]]] = []
    for row in rows:
        if rules and rules[-1][0] == row.kernel_class:
            rules[-1][1].append(row.regex)
        else:
            rules.append((row.kernel_class, [row.regex]))
    return tuple((cls, "|".join(parts)) for cls, parts in rules)


# (class, case-insensitive regex), tried in order; every branch starts with a literal (token_regex).
DEFAULT_RULES: tuple[tuple[str, str], ...] = _class_rules(PATTERNS)


@dataclass(frozen=True)
class KernelClassifier:
    """Ordered (class, case-insensitive regex) rules; first match wins, else ``other``.

    Speed: a case-insensitive search cannot use the regex engine's literal-prefix scan, so it is ~4x slower
    than a case-sensitive one on long C++ kernel names. For an ASCII name and a rule whose pattern text is
    ASCII and all lower case, ``IGNORECASE`` search on the name equals case-sensitive search on
    ``name.lower()`` (every literal and class then folds the same way), so such rules also keep a
    case-sensitive twin used on the lowered name. Results are memoized per name.
    """

    rules: tuple[tuple[str, re.Pattern[str]], ...]
    _lower_twins: tuple[re.Pattern[str] | None, ...] = field(init=False, repr=False, compare=False)
    _memo: dict[str, str] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        twins = tuple(_lower_twin(p.pattern) for _, p in self.rules)
        object.__setattr__(self, "_lower_twins", twins)

    def classify(self, name: str) -> str:
        cls = self._memo.get(name)
        if cls is None:
            cls = self._classify(name)
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[name] = cls
        return cls

    def _classify(self, name: str) -> str:
        lowered = name.lower() if name.isascii() else None
        for (cls, pattern), twin in zip(self.rules, self._lower_twins, strict=True):
            hit = twin.search(lowered) if twin is not None and lowered is not None else pattern.search(name)
            if hit:
                return cls
        return "other"

    def classify_ops(self, kinds: pd.Series | np.ndarray, names: pd.Series | np.ndarray) -> np.ndarray:
        """Class per op: memcpy/memset by kind, kernels by name (each distinct name matched once)."""
        names = np.asarray(names, dtype=object)
        code: dict[Any, int] = {}
        codes = np.fromiter((code.setdefault(n, len(code)) for n in names.tolist()), np.int64, len(names))
        out = np.array([self.classify(str(n)) for n in code] + [""], dtype=object)[codes]
        kinds = np.asarray(kinds, dtype=object)
        out[kinds == schema.MEMCPY] = "memcpy"
        out[kinds == schema.MEMSET] = "memset"
        return out


_MEMO_MAX = 100_000


def _lower_twin(pattern: str) -> re.Pattern[str] | None:
    """A case-sensitive pattern that matches a lowered ASCII name iff ``pattern`` (IGNORECASE) matches it.

    That is the pattern itself when it is ASCII lower case, or the pattern with upper-case letters lowered
    when every such letter is a plain literal (``ncclDevKernel``): not escaped (``\\D``, ``\\A``), not in a
    character class (``[A-z]`` != ``[a-z]``) and not in a ``(?...)`` group header. Else None (use
    IGNORECASE on the name).
    """
    if not pattern.isascii():
        return None
    if pattern == pattern.lower():
        return re.compile(pattern)
    if "(?" in pattern:
        return None
    escaped = in_class = False
    for ch in pattern:
        if escaped:
            if ch.isupper():
                return None
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            if ch.isupper():
                return None
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
    try:
        return re.compile(pattern.lower())
    except re.error:  # pragma: no cover -- e.g. a class opened by "[]" whose letters became a bad range
        return None


def _compile(rules: Iterable[tuple[str, str]]) -> tuple[tuple[str, re.Pattern[str]], ...]:
    return tuple((cls, re.compile(p, re.IGNORECASE)) for cls, p in rules)


DEFAULT = KernelClassifier(_compile(DEFAULT_RULES))


def with_rules(extra: Iterable[tuple[str, str]]) -> KernelClassifier:
    """A classifier whose ``extra`` (class, regex) rules are tried before the defaults."""
    return KernelClassifier(_compile(extra) + DEFAULT.rules)


_ROW_REGEXES: tuple[tuple[PatternRow, re.Pattern[str], re.Pattern[str]], ...] = tuple(
    (row, re.compile(row.regex), re.compile(row.regex, re.IGNORECASE)) for row in PATTERNS
)


@functools.lru_cache(maxsize=65536)
def match_row(name: str) -> PatternRow | None:
    """The first ``kernel_patterns.toml`` row that matches ``name`` (None: no row; the class is
    ``other``). ``DEFAULT.classify(name)`` is this row's class; precision detection reads its
    ``precision``."""
    lowered = name.lower() if name.isascii() else None
    for row, twin, pattern in _ROW_REGEXES:
        if (twin.search(lowered) if lowered is not None else pattern.search(name)) is not None:
            return row
    return None


def kernel_table(ops: pd.DataFrame, classifier: KernelClassifier = DEFAULT) -> pd.DataFrame:
    """One row per (device, kind, name): count, total/mean/max duration, class (``schema.KERNEL_COLUMNS``).

    Rows: device ascending, then total time descending, ties by (kind, name) in code-point order (grouped in
    the engine: ``gpu_tables.KERNELS_SQL``)."""
    import pandas as pd
    import pyarrow as pa

    from tracing.ingest import engine

    cols = {
        c: ops[c].astype(object) if c in ("kind", "name") else ops[c]
        for c in ("device", "kind", "name", "dur_ns")
    }
    with engine.session() as con:
        con.register("ops", pa.Table.from_pandas(pd.DataFrame(cols), preserve_index=False))
        return kernel_groups_frame(con, classifier)


def kernel_groups_frame(con: Any, classifier: KernelClassifier = DEFAULT) -> pd.DataFrame:
    """The kernel table of the engine's ``ops`` (:func:`kernel_table`)."""
    return schema.to_frame(kernel_groups_table(con, classifier))


def kernel_groups_table(con: Any, classifier: KernelClassifier = DEFAULT) -> pa.Table:
    """:func:`kernel_groups_frame` as an Arrow table (``schema.KERNEL_COLUMNS`` but trace / rank)."""
    from tracing.analysis import gpu_tables

    k = gpu_tables.kernel_groups(con)
    return kernel_rows(
        *(
            k[c].to_numpy(zero_copy_only=False)
            for c in ("device", "kind", "name", "count", "total_ns", "max_ns")
        ),
        classifier,
    )


def kernel_rows(
    device: np.ndarray,
    kinds: np.ndarray,
    names: np.ndarray,
    count: np.ndarray,
    total: np.ndarray,
    max_ns: np.ndarray,
    classifier: KernelClassifier = DEFAULT,
) -> pa.Table:
    """The kernel table from its groups given in (device, kind, name) order (values ascending, strings in
    code-point order): rows by device ascending, then total time descending, ties kept in that order."""
    cols = [c for c in schema.KERNEL_COLUMNS if c not in ("trace", "rank")]
    rows = np.lexsort((-total, device))  # stable: equal totals keep (kind, name) order
    kinds, names, count, total = kinds[rows], names[rows], count[rows].astype(np.int64), total[rows]
    values = {
        "device": device[rows],
        "kind": kinds,
        "name": names,
        "kernel_class": classifier.classify_ops(kinds, names),
        "count": count,
        "total_ns": total,
        "mean_ns": total / count,
        "max_ns": max_ns[rows],
    }
    return schema.make_table(values, {c: schema.KERNEL_COLUMNS[c] for c in cols}, "kernels")


def _sorted_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes whose order is the values' sorted order (-1 = missing), and the sorted uniques."""
    import pandas as pd

    codes, uniques = pd.factorize(values)
    uniques = np.asarray(uniques, dtype=values.dtype if values.dtype != object else object)
    if values.dtype == object:
        uniques = np.array([str(u) for u in uniques], dtype=object)
    rank = np.empty(len(uniques), np.int64)
    by_value = np.argsort(uniques, kind="stable")
    rank[by_value] = np.arange(len(uniques))
    return np.append(rank, -1)[codes], uniques[by_value]  # code -1 picks the appended -1


def class_totals(kernels: pd.DataFrame) -> pd.DataFrame:
    """Total time per (device, class) from a kernel table, with the share of all GPU-op time.

    Rows: device ascending, then total time descending (ties by class name). Grouped on integer codes
    (exact int64 sums); an empty table, a missing class or non-int64 device / total columns take the pandas
    groupby path, which gives the same table.
    """
    import pandas as pd

    classes = kernels["kernel_class"]
    plain = kernels["device"].dtype == np.int64 and kernels["total_ns"].dtype == np.int64
    if len(kernels) == 0 or not plain or classes.isna().any():
        return _class_totals_groupby(kernels)
    dev_codes, dev_uniq = _sorted_codes(kernels["device"].to_numpy(np.int64))
    cls_codes, cls_uniq = _sorted_codes(classes.to_numpy(object))
    key = dev_codes * len(cls_uniq) + cls_codes
    total_ns = kernels["total_ns"].to_numpy(np.int64)
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    total = np.add.reduceat(total_ns[order], first)
    dev_i, cls_i = key[first] // len(cls_uniq), key[first] % len(cls_uniq)
    device_total = np.zeros(len(dev_uniq), np.int64)
    np.add.at(device_total, dev_i, total)
    rows = np.lexsort((-total, dev_i))  # stable: equal totals keep class order
    with np.errstate(divide="ignore", invalid="ignore"):  # a device with zero time: NaN, as pandas gives
        share = total[rows] / device_total[dev_i][rows]
    return pd.DataFrame(
        {
            "device": dev_uniq[dev_i][rows],
            "kernel_class": pd.array(cls_uniq[cls_i][rows], dtype=classes.dtype),
            "total_ns": total[rows],
            "share": share,
        }
    )


def _class_totals_groupby(kernels: pd.DataFrame) -> pd.DataFrame:
    """:func:`class_totals` by a pandas groupby (the reference)."""
    t = kernels.groupby(["device", "kernel_class"], observed=True)["total_ns"].sum().reset_index()
    t["share"] = t["total_ns"] / t.groupby("device")["total_ns"].transform("sum")
    return t.sort_values(["device", "total_ns"], ascending=[True, False]).reset_index(drop=True)
