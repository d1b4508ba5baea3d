"""mxperf: does MXFP8 pay off for your RL run, where does the time go, is your sampler on the learner's grid?

The importable packages follow the data flow: ``tracing`` (raw trace -> event tables -> metrics),
``perfmodel`` (cost-model fits, breakeven), ``dashboards`` (Streamlit), and ``pipeline`` (the RL loop that
produces runs). This package is the top floor: the ``mxperf`` command line (``cli``, ``commands/``) and the
notebook facade over every stage, ``mxperf.open(path)`` (``notebook``: tracing.open's tables plus the kernel
summary and the diff). ``open`` resolves lazily, so the command line never imports pandas for it.
"""

from __future__ import annotations

import importlib
from typing import Any

from tracing.outputs.version import __version__

_API: dict[str, str] = {"open": "mxperf.notebook", "Tables": "mxperf.notebook"}

__all__ = ["Tables", "__version__", "open"]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'mxperf' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
