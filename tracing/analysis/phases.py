"""Range names -> canonical RL phases (generate, logprob, update, sync, reward, other).

mxperf, verl and NeMo RL name the same phases differently (``update/microbatch``, ``update_actor``,
``policy_training``). The mapping is data, in ``phase_map.toml`` next to this module: ordered rules of
(regular expression, phase), first match wins, no match -> ``other``. Users extend it with their own file.
"""

from __future__ import annotations

import functools
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tracing.outputs.errors import InputError
from tracing.outputs.schema import PHASES

DEFAULT_PHASE_MAP = Path(__file__).with_name("phase_map.toml")


@dataclass(frozen=True)
class PhaseMap:
    """Ordered (compiled pattern, phase) rules."""

    rules: tuple[tuple[re.Pattern[str], str], ...]

    def phase_of(self, name: str) -> str:
        return _cached_phase(self, name)


@functools.lru_cache(maxsize=65536)
def _cached_phase(pm: PhaseMap, name: str) -> str:
    for pattern, phase in pm.rules:
        if pattern.search(name):
            return phase
    return "other"


def load_phase_map(path: str | os.PathLike[str]) -> PhaseMap:
    """Parse a phase-map TOML file (``[[rule]] pattern = '...' phase = '...'``)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such phase map") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from None
    rules = []
    for i, rule in enumerate(data.get("rule", [])):
        pattern, phase = rule.get("pattern"), rule.get("phase")
        if not isinstance(pattern, str) or phase not in PHASES:
            raise InputError(f"{path}: rule {i} needs a string 'pattern' and a 'phase' in {PHASES}")
        try:
            rules.append((re.compile(pattern, re.IGNORECASE), phase))
        except re.error as exc:
            raise InputError(
                f"{path}: rule {i} pattern {pattern!r} is not a regular expression ({exc})"
            ) from None
    return PhaseMap(tuple(rules))


@functools.cache
def default_phase_map() -> PhaseMap:
    return load_phase_map(DEFAULT_PHASE_MAP)


def phase_of(name: str) -> str:
    """Canonical phase of a range name with the default map."""
    return default_phase_map().phase_of(name)
