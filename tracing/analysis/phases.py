"""Range names -> canonical RL phases (generate, logprob, update, sync, reward, other).

The mapping is data (docs/tracing.md, "Phase maps"): ``phase_map.toml`` next to this module, ordered rules of
(regular expression, phase), each with an optional ``framework`` and ``note``, and ``[[source]]`` entries
naming where its names were read. Users pass their own file.
"""

from __future__ import annotations

import functools
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tracing.outputs import schema
from tracing.outputs.errors import InputError
from tracing.outputs.schema import PHASES

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_PHASE_MAP = Path(__file__).with_name("phase_map.toml")
_RULE_KEYS = frozenset({"pattern", "phase", "framework", "note"})


@dataclass(frozen=True)
class PhaseMap:
    """Ordered (compiled pattern, phase) rules; ``frameworks[i]`` names the framework rule ``i`` is for ("" =
    generic); ``sources`` are the file's ``[[source]]`` tables (where the names were read)."""

    rules: tuple[tuple[re.Pattern[str], str], ...]
    frameworks: tuple[str, ...] = ()
    sources: tuple[tuple[tuple[str, str], ...], ...] = ()

    def phase_of(self, name: str) -> str:
        return _cached_phase(self, name)

    def rule_for(self, name: str) -> int | None:
        """Index of the rule that decides ``name`` (None: no rule matches, so ``other``)."""
        for i, (pattern, _) in enumerate(self.rules):
            if pattern.search(name):
                return i
        return None


@functools.lru_cache(maxsize=65536)
def _cached_phase(pm: PhaseMap, name: str) -> str:
    i = pm.rule_for(name)
    return "other" if i is None else pm.rules[i][1]


def load_phase_map(path: str | os.PathLike[str]) -> PhaseMap:
    """Parse a phase-map TOML file (``[[rule]] pattern = '...' phase = '...'``)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such phase map") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from None
    rules, frameworks = [], []
    for i, rule in enumerate(data.get("rule", [])):
        if not isinstance(rule, dict):
            raise InputError(f"{path}: rule {i} is not a table ([[rule]] pattern = '...' phase = '...')")
        unknown = sorted(set(rule) - _RULE_KEYS)
        if unknown:
            raise InputError(
                f"{path}: rule {i} has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_RULE_KEYS))}"
            )
        pattern, phase = rule.get("pattern"), rule.get("phase")
        if not isinstance(pattern, str) or phase not in PHASES:
            raise InputError(f"{path}: rule {i} needs a string 'pattern' and a 'phase' in {PHASES}")
        try:
            rules.append((re.compile(pattern, re.IGNORECASE), phase))
        except re.error as exc:
            raise InputError(
                f"{path}: rule {i} pattern {pattern!r} is not a regular expression ({exc})"
            ) from None
        frameworks.append(str(rule.get("framework", "")))
    sources = tuple(
        tuple((str(k), str(v)) for k, v in s.items()) for s in data.get("source", []) if isinstance(s, dict)
    )
    return PhaseMap(tuple(rules), tuple(frameworks), sources)


@functools.cache
def default_phase_map() -> PhaseMap:
    return load_phase_map(DEFAULT_PHASE_MAP)


def phase_of(name: str) -> str:
    """Canonical phase of a range name with the default map."""
    return default_phase_map().phase_of(name)


def range_log_columns(log: pa.Table, phase_map: PhaseMap) -> dict[str, Any]:
    """mxperf's range log as range columns (its own ids, nesting and attributes; each name's phase from
    ``phase_map``): what ``mxperf ingest`` and a run folder's step table read."""

    names = [str(n) for n in log.column("name").to_pylist()]
    phases = {n: phase_map.phase_of(n) for n in set(names)}
    start, end = (log.column(c).to_numpy().astype(np.int64) for c in ("start_ns", "end_ns"))
    return {
        "source": "rangelog",
        "range_id": log.column("range_id").to_numpy().astype(np.int64),
        "parent_id": log.column("parent_id").to_numpy().astype(np.int64),
        "depth": log.column("depth").to_numpy().astype(np.int64),
        "name": names,
        "domain": "",
        "phase": [phases[n] for n in names],
        "pid": schema.NO_ID,
        "tid": log.column("tid").to_numpy().astype(np.int64),
        "start_ns": start,
        "end_ns": end,
        "wall_ns": end - start,
        "attrs": [str(a) for a in log.column("attrs").to_pylist()],
    }
