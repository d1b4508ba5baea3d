"""GPU op classes by name pattern, so "time spent quantizing" or "time in NCCL" is one number.

The classes and their rules (the rows of ``kernel_patterns.toml``, tried in file order, first match wins, each
token matching whole name tokens: :func:`token_regex`) are docs/tracing.md's ("Kernel classes"). GEMM rows
also say how to read the operand precision (``tracing.analysis.precision``). Extend with :func:`with_rules`
(your rules, plain case-insensitive regexes, are tried first).
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

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        """:attr:`regex` compiled (on first use: an ingest compiles only the rows it tries), searched in
        lowered names."""
        return re.compile(self.regex)


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
    if problem:
        raise ValueError(f"kernel pattern {row_id!r}: token {token!r} {problem}")


def load_patterns(path: str | Path = PATTERNS_PATH, *, compile_rows: bool = True) -> tuple[PatternRow, ...]:
    """The rows of a kernel-pattern table (``kernel_patterns.toml``), checked (``compile_rows``: each row's
    regex compiles, else a ValueError naming the row and token)."""
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
        if compile_rows:
            _compile(rows[-1])
    return tuple(rows)


def _compile(row: PatternRow) -> None:
    try:
        row.pattern  # noqa: B018 (compiled and kept)
    except re.error:
        for t in row.tokens:
            try:
                re.compile(token_regex(t))
            except re.error as exc:
                raise ValueError(f"kernel pattern {row.id!r}: token {t!r} does not compile ({exc})") from None
        raise


# the shipped table, its rows compiled when first tried (tests/unit/test_kernel_patterns.py compiles them all)
PATTERNS: tuple[PatternRow, ...] = load_patterns(compile_rows=False)


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
    """Ordered (class, regex) rules searched in the lower-cased name; first match wins, else ``other``.

    The table's tokens are ASCII lower case (checked on load), so a case-sensitive search of the lowered name
    is the case-insensitive match, and it keeps the regex engine's literal-prefix scan (an ``IGNORECASE``
    search is ~4x slower on long C++ names and ~5x slower to compile). Results are memoized per name.
    """

    rules: tuple[tuple[str, str, int], ...]  # (class, regex, re flags)
    _memo: dict[str, str] = field(init=False, repr=False, compare=False, default_factory=dict)

    @functools.cached_property
    def _patterns(self) -> tuple[tuple[str, re.Pattern[str]], ...]:
        """The rules compiled, on first use (~20 ms: a trace without kernels never pays it)."""
        return tuple((cls, re.compile(p, flags)) for cls, p, flags in self.rules)

    def classify(self, name: str) -> str:
        cls = self._memo.get(name)
        if cls is None:
            lowered = name.lower()
            cls = next((c for c, pattern in self._patterns if pattern.search(lowered)), "other")
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[name] = cls
        return cls

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

DEFAULT = KernelClassifier(tuple((cls, p, 0) for cls, p in DEFAULT_RULES))


def with_rules(extra: Iterable[tuple[str, str]]) -> KernelClassifier:
    """A classifier whose ``extra`` (class, case-insensitive regex) rules are tried before the defaults
    (each compiled here: a bad regex raises ``re.error`` at once)."""
    mine = tuple((cls, p, int(re.IGNORECASE)) for cls, p in extra)
    for _, p, flags in mine:
        re.compile(p, flags)
    return KernelClassifier(mine + DEFAULT.rules)


@functools.lru_cache(maxsize=65536)
def match_row(name: str) -> PatternRow | None:
    """The first ``kernel_patterns.toml`` row that matches ``name`` (None: no row; the class is
    ``other``). ``DEFAULT.classify(name)`` is this row's class; precision detection reads its
    ``precision``."""
    cls = DEFAULT.classify(name)  # the first matching row's class: only that class's rows are tried
    lowered = name.lower()
    return next((r for r in PATTERNS if r.kernel_class == cls and r.pattern.search(lowered)), None)


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
        return schema.to_frame(kernel_groups_table(con, classifier))


def kernel_groups_table(con: Any, classifier: KernelClassifier = DEFAULT) -> pa.Table:
    """:func:`kernel_table` of the engine's ``ops`` as an Arrow table (``schema.KERNEL_COLUMNS`` but trace /
    rank), in ``gpu_tables.KERNELS_SQL``'s row order."""
    from tracing.analysis import gpu_tables

    k = gpu_tables.kernel_groups(con)
    kinds, names, total = (k[c].to_numpy(zero_copy_only=False) for c in ("kind", "name", "total_ns"))
    count = k["count"].to_numpy(zero_copy_only=False).astype(np.int64)
    values = {
        "device": k["device"].to_numpy(zero_copy_only=False),
        "kind": kinds,
        "name": names,
        "kernel_class": classifier.classify_ops(kinds, names),
        "count": count,
        "total_ns": total,
        "mean_ns": total / count,
        "max_ns": k["max_ns"].to_numpy(zero_copy_only=False),
    }
    cols = [c for c in schema.KERNEL_COLUMNS if c not in ("trace", "rank")]
    return schema.make_table(values, {c: schema.KERNEL_COLUMNS[c] for c in cols}, "kernels")


def class_totals(kernels: pd.DataFrame) -> pd.DataFrame:
    """Total time per (device, class) from a kernel table, with the share of all GPU-op time.

    Rows: device ascending, then total time descending (ties by class name)."""
    t = kernels.groupby(["device", "kernel_class"], observed=True)["total_ns"].sum().reset_index()
    t["share"] = t["total_ns"] / t.groupby("device")["total_ns"].transform("sum")
    return t.sort_values(["device", "total_ns", "kernel_class"], ascending=[True, False, True]).reset_index(
        drop=True
    )
