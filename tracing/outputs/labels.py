"""Labels a foreign trace lacks (model, precision, micro-batch size), from ``--label`` or a sidecar file.

    mxperf ingest run.json.gz -o out/ --label model=qwen3-8b,precision=mxfp8,tokens_per_microbatch=4096

or, next to the trace, ``mxperf.toml``::

    [labels]                # (or the same keys at top level)
    model = "qwen3-8b"
    precision = "mxfp8"     # a docs/contracts.md precision id
    tokens_per_microbatch = 4096
    phase = "update"        # optional: canonical phase of the micro-batch ranges
    repeat = 0              # optional

Command-line labels override the sidecar's.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from tracing.outputs.errors import InputError
from tracing.outputs.precisions import PRECISION_IDS
from tracing.outputs.schema import PHASES

SIDECAR = "mxperf.toml"
_INT_KEYS = ("tokens_per_microbatch", "repeat")


@dataclass(frozen=True)
class Labels:
    model: str | None = None
    precision: str | None = None
    tokens_per_microbatch: int | None = None
    phase: str | None = None
    repeat: int | None = None

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in PRECISION_IDS:
            raise InputError(
                f"label precision={self.precision!r} is not a precision id; use one of {', '.join(PRECISION_IDS)}"
            )
        if self.phase is not None and self.phase not in PHASES:
            raise InputError(
                f"label phase={self.phase!r} is not a canonical phase; use one of {', '.join(PHASES)}"
            )
        size, repeat = self.tokens_per_microbatch, self.repeat  # int64 columns hold them
        if size is not None and not 0 < size <= 2**62:
            raise InputError(f"label tokens_per_microbatch={size} must be a positive integer up to 2^62")
        if repeat is not None and not 0 <= repeat <= 2**62:
            raise InputError(f"label repeat={repeat} must be a whole number from 0 to 2^62")

    @property
    def complete(self) -> bool:
        """True when a micro-batch table can be written (model, precision and size known)."""
        return None not in (self.model, self.precision, self.tokens_per_microbatch)

    def missing(self) -> list[str]:
        return [k for k in ("model", "precision", "tokens_per_microbatch") if getattr(self, k) is None]

    def merged(self, override: Labels) -> Labels:
        """These labels with every field that ``override`` sets replaced."""
        return replace(self, **override.as_dict())

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def _from_mapping(data: dict[str, Any], origin: str) -> Labels:
    known = {f.name for f in fields(Labels)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(
            f"{origin}: unknown label(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in _INT_KEYS:
            try:
                values[key] = int(value)
            except (TypeError, ValueError):
                raise InputError(f"{origin}: label {key}={value!r} is not an integer") from None
        else:
            values[key] = str(value)
    try:
        return Labels(**values)
    except InputError as exc:
        raise InputError(f"{origin}: {exc}") from None


def parse_labels(text: str | None) -> Labels:
    """``model=M,precision=P,tokens_per_microbatch=N[,phase=update]`` -> Labels."""
    if not text:
        return Labels()
    data: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InputError(f"--label {text!r}: expected key=value[,key=value...], got {part!r}")
        data[key.strip()] = value.strip()
    return _from_mapping(data, "--label")


def sidecar_labels(trace_path: str | os.PathLike[str], *, overridden: Iterable[str] = ()) -> Labels:
    """Labels from ``mxperf.toml`` in the trace's directory (or inside it, for a run directory).

    Keys in ``overridden`` (set on the command line, which wins) are neither read nor checked."""
    p = Path(trace_path)
    path = (p if p.is_dir() else p.parent) / SIDECAR
    if not path.is_file():
        return Labels()
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not valid TOML ({exc})") from None
    section = data.get("labels", data.get("label", data))
    if not isinstance(section, dict):
        raise InputError(f"{path}: [labels] must be a table")
    skip = set(overridden)
    return _from_mapping({k: v for k, v in section.items() if k not in skip}, str(path))
