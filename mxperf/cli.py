"""The ``mxperf`` command line: a thin dispatcher over subcommand modules.

Each subcommand is one thin module in ``mxperf.commands`` exposing ``HELP: str``,
``add_arguments(parser) -> None`` and ``run(args) -> int`` (parse, validate, call the library, print). Those
modules import their heavy dependencies (torch, transformers) inside ``run`` so that ``mxperf ingest`` or
``mxperf fit`` work without a training stack. The library packages never import this one.

Bad input raises ``tracing.outputs.errors.MxperfError`` (or a subclass); the dispatcher prints one line and
exits 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence

from tracing.outputs.version import __version__

# name -> module. Order is the order shown in --help (the user journeys: run, sweep, fit, dash, ingest).
COMMANDS: dict[str, str] = {
    name: f"mxperf.commands.{name}"
    for name in (
        "demo",
        "run",
        "sweep",
        "pretrain",
        "consistency",
        "faults",
        "fit",
        "dash",
        "ingest",
        "ranges",
        "annotate",
    )
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mxperf",
        description="Profile BF16 vs MXFP8 RL runs, fit the breakeven micro-batch size, check weight syncs.",
    )
    parser.add_argument("--version", action="version", version=f"mxperf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod_name in COMMANDS.items():
        mod = importlib.import_module(mod_name)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, ``timeout``, ``kill``), raised where the process is, so that an output directory
    being written is marked ``interrupted`` and child processes are stopped, as on Ctrl-C."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    from tracing.outputs.store import use_system_allocator

    use_system_allocator()  # a smaller footprint per process (its docstring says why); forked workers inherit it
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _dispatch(argv)
    except BrokenPipeError:  # `mxperf ranges ... | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _dispatch(argv: Sequence[str] | None) -> int:
    from tracing.outputs.errors import MxperfError

    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_module", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._module.run(args) or 0)
    except MxperfError as exc:
        print(f"mxperf {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        print(f"mxperf {args.command}: error: {exc.strerror or exc}: {exc.filename}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"mxperf {args.command}: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"mxperf {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
