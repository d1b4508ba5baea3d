"""The ``mxperf`` command line: a thin dispatcher over subcommand modules, with one rule for errors.

Each subcommand is one module in ``mxperf.commands`` exposing ``add_arguments(parser)`` and ``run(args) -> int``
(parse, validate, call the library, print); its one-line help lives here, so ``mxperf --help`` imports no
command and only the chosen command's parser is built (heavy imports happen inside ``run``).

The error rule: bad input (:class:`tracing.outputs.errors.MxperfError`), any OSError (missing, unreadable or
unwritable file, read-only or full disk), a ValueError from validation, a decode error or a missing optional
package prints one line ``mxperf CMD: error: ...`` and exits 2; Ctrl-C exits 130, SIGTERM 143. Anything else
is a bug and keeps its traceback; ``MXPERF_DEBUG=1`` shows the traceback of every error.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.util
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from tracing.outputs.version import __version__

TRAIN = ("torch", "transformers", "tokenizers")  # the `train` extra: what the RL pipeline imports
INSTALL_TRAIN = "pip install 'mxperf[train]' (torch 2.13 CPU first: see README, Set up)"

# name -> (help, packages the command needs beyond the base install). Order: the user journeys.
COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "demo": (
        "run the main job: sweep tiny-dense bf16 vs mxfp8, fit the cost model, print the verdict",
        TRAIN,
    ),
    "run": (
        "run GRPO steps with a BF16, MXFP8 or FP8 learner and sampler; write metrics, ranges, sync checks",
        TRAIN,
    ),
    "sweep": (
        "time learner updates on identical data across micro-batch sizes and precisions (microbatches.parquet)",
        TRAIN,
    ),
    "pretrain": ("supervised warm-start on the task (cached under $MXPERF_CACHE or ~/.cache/mxperf)", TRAIN),
    "consistency": (
        "compare sampler-learner mismatch (KL) for every precision pairing at fixed weights",
        TRAIN,
    ),
    "faults": (
        "inject each weight-sync fault into a live run; print which invariant caught it and what it cost",
        TRAIN,
    ),
    "fit": (
        "fit fixed + per-token cost per micro-batch, find the breakeven size vs a baseline, write a report",
        (),
    ),
    "dash": ("open the Streamlit dashboard (BF16 vs MXFP8 side by side) over a folder of mxperf outputs", ()),
    "ingest": (
        "ingest Kineto / Nsight Systems traces or an mxperf run: events, GPU busy, host stall, per-range time",
        (),
    ),
    "ranges": ("per-range wall time, attributed GPU busy and host stall from an ingest directory", ()),
    "annotate": (
        "add GPU busy / host stall tracks per device to a trace (opens in Perfetto or chrome://tracing)",
        (),
    ),
    "kernels": (
        "top kernels and classes of an ingest: time, share of busy, per phase / micro-batch, roofline",
        (),
    ),
    "diff": (
        "why two ingests differ (e.g. BF16 vs MXFP8): GEMM, cast, other kernels, host stall, residual",
        (),
    ),
}
# A missing module -> what to install (the extras in pyproject.toml).
EXTRA_OF = {
    "torch": INSTALL_TRAIN,
    "transformers": INSTALL_TRAIN,
    "tokenizers": INSTALL_TRAIN,
    "safetensors": INSTALL_TRAIN,
    "nvtx": INSTALL_TRAIN,
    "megatron": "pip install 'mxperf[megatron]'",
    "ray": "pip install 'mxperf[ray]'",
    "vllm": "make vllm (vLLM lives in its own venv, .venv-vllm)",
    "transformer_engine": "a CUDA machine with Transformer Engine (the `gpu` extra)",
}
DEBUG_ENV = "MXPERF_DEBUG"
OWN_PACKAGES = ("mxperf", "tracing", "perfmodel", "pipeline", "dashboards")


def missing_packages(names: Sequence[str]) -> list[str]:
    """The packages among ``names`` that this install cannot import (found without importing them)."""
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def needs_line(command: str, missing: Sequence[str]) -> str:
    return f"mxperf {command} needs {', '.join(missing)}, which this install lacks: {INSTALL_TRAIN}"


class _Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Append ``(default: X)`` to every option whose help does not already state its default."""
    for action in parser._actions:
        d = action.default
        if (
            not action.option_strings
            or action.required
            or d is None
            or d is False
            or d is argparse.SUPPRESS
            or d == []
            or action.help is argparse.SUPPRESS
        ):
            continue
        text = action.help or ""
        if "default" in text.lower():
            continue
        action.help = f"{text} (default: %(default)s)" if text else "default: %(default)s"


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (the first word that is not an option)."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


class _Parser(argparse.ArgumentParser):
    """A bad flag or value is one line naming it, as all bad input is (not argparse's usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s options are built (its module is imported), the rest list their help."""
    parser = _Parser(
        prog="mxperf",
        description="Profile BF16 vs MXFP8 RL runs, fit the breakeven micro-batch size, check weight syncs.",
        epilog="`mxperf COMMAND --help` for a command's options. Bad input: one line, exit 2 "
        f"({DEBUG_ENV}=1 for a traceback).",
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"mxperf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (text, needs) in COMMANDS.items():
        missing = missing_packages(needs) if needs else []
        listed = f"{text} [needs {INSTALL_TRAIN.split(' (')[0]}]" if missing else text
        p = sub.add_parser(name, help=listed, description=text, formatter_class=_Formatter)
        if name == command and not missing:
            mod = importlib.import_module(f"mxperf.commands.{name}")
            mod.add_arguments(p)
            show_defaults(p)
            p.set_defaults(_module=mod)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, ``timeout``, ``kill``), raised where the process is, so that an output directory
    being written is marked ``interrupted`` and child processes are stopped, as on Ctrl-C."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # `mxperf ranges ... | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def entry() -> None:
    """The ``mxperf`` console script and ``python -m mxperf``: :func:`main`, then leave the process at once.

    The interpreter's own shutdown (tearing down pandas', pyarrow's and numpy's modules one object at a time)
    costs 35-55 ms after an ingest whose work is done and written. So once the command has returned: run
    the ``atexit`` handlers (children stopped, temp folders removed, logs flushed), flush stdout and stderr,
    and ``os._exit``. Only when nothing else could still need the teardown: no other thread alive (the
    interpreter would join non-daemon ones); otherwise a normal ``sys.exit``. In-process callers (tests,
    notebooks) call :func:`main` and keep the normal shutdown."""
    code = main()
    if threading.active_count() != 1:
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that left (`| head`), or a closed stream
            code = code or 1
    os._exit(code)


# Commands whose path builds Arrow tables only: pyarrow must not import pandas for them (store.arrow_without_pandas)
ARROW_ONLY = frozenset({"ingest", "ranges", "annotate"})


def _dispatch(argv: list[str]) -> int:
    command = _chosen(argv)
    who = f"mxperf {command}" if command in COMMANDS else "mxperf"
    if command in COMMANDS:
        missing = missing_packages(COMMANDS[command][1])
        if missing:
            print(f"{who}: error: {needs_line(command, missing)}", file=sys.stderr)
            return 2
    try:  # building the parser imports the command's module: the same rule covers it
        with _imports_uncollected():
            parser = build_parser(command)
        args = parser.parse_args(argv)
        if getattr(args, "_module", None) is None:
            parser.print_help(sys.stderr)
            return 2
        if command in ARROW_ONLY:
            from tracing.outputs.store import arrow_without_pandas

            with arrow_without_pandas():
                return int(args._module.run(args) or 0)
        return int(args._module.run(args) or 0)
    except Terminated:
        print(f"{who}: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"{who}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise
    except Exception as exc:
        line = one_line(exc)
        if line is None or os.environ.get(DEBUG_ENV):
            raise
        from tracing.outputs.errors import shown

        print(f"{who}: error: {shown(line)}", file=sys.stderr)  # the output's name, never its temp folder
        return 2


@contextlib.contextmanager
def _imports_uncollected() -> Iterator[None]:
    """In a fresh process (pandas not imported yet), no garbage collection while the command's modules are
    imported, then freeze what they made: it lives as long as the process, and later collections skip it.

    Imports make almost no garbage (~750 objects for ``mxperf ingest``'s) but ~120k tracked objects, which
    the collector would otherwise traverse again and again (0.06-0.09 s of a 0.9 s ingest). In-process
    callers that already imported pandas (tests, notebooks), or run without a collector, keep theirs as it is."""
    fresh = "pandas" not in sys.modules and gc.isenabled()
    if fresh:
        gc.disable()
    try:
        yield
    finally:
        if fresh:
            gc.enable()
            gc.freeze()


def one_line(exc: BaseException) -> str | None:
    """The one line an error prints, or None for a bug (which keeps its traceback)."""
    from tracing.outputs.errors import MxperfError

    if isinstance(exc, MxperfError):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError):
        top = (exc.name or "").split(".")[0]
        if top in OWN_PACKAGES:
            return f"'{top}' is part of mxperf but not importable here: reinstall it (make install, or pip install -e .)"
        how = EXTRA_OF.get(top, f"pip install {top}" if top else "check the install")
        return f"needs the Python package '{top or exc}', which this install lacks: {how}"
    if isinstance(exc, OSError):
        what = exc.strerror or str(exc)
        if exc.filename is None:
            return what
        where = str(exc.filename) + (f" -> {exc.filename2}" if exc.filename2 else "")
        return f"{where}: {what}"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    sqlite3 = sys.modules.get("sqlite3")
    zlib = sys.modules.get("zlib")
    decode = (EOFError, *(t for t in (getattr(sqlite3, "Error", None), getattr(zlib, "error", None)) if t))
    if isinstance(exc, (ValueError, *decode)):
        text = str(exc).strip() or type(exc).__name__
        return f"{text} ({_raised_at(exc)}; {DEBUG_ENV}=1 for the traceback)"
    return None


def _raised_at(exc: BaseException) -> str:
    """``package/module.py:LINE`` of the innermost mxperf frame an error passed through."""
    root = Path(__file__).resolve().parents[1]
    where = type(exc).__name__
    tb = exc.__traceback__
    while tb is not None:
        path = Path(tb.tb_frame.f_code.co_filename)
        if path.is_relative_to(root) and ".venv" not in path.parts:
            where = f"{type(exc).__name__} at {path.relative_to(root)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


if __name__ == "__main__":  # ``python -m mxperf.cli``: the same as ``mxperf`` (and ``python -m mxperf``)
    entry()
