"""The ``mxperf`` command line: a thin dispatcher over subcommand modules.

Each subcommand lives next to the code it drives, in a module exposing ``HELP: str``,
``add_arguments(parser) -> None`` and ``run(args) -> int``. Those modules must import their heavy
dependencies (torch, transformers) inside ``run`` so that ``mxperf ingest`` or ``mxperf fit`` work
without a training stack. Only modules that exist are registered: there are no placeholder commands.

Bad input raises ``tracing.errors.MxperfError`` (or a subclass); the dispatcher prints one line and
exits 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys
import threading
from collections.abc import Sequence

from mxperf import __version__

# name -> module. Order is the order shown in --help (the user journeys: run, sweep, fit, dash, ingest).
COMMANDS: dict[str, str] = {
    "demo": "pipeline.cli_demo",
    "run": "pipeline.cli_run",
    "sweep": "pipeline.cli_sweep",
    "pretrain": "pipeline.cli_pretrain",
    "consistency": "pipeline.cli_consistency",
    "faults": "pipeline.cli_faults",
    "fit": "perfmodel.cli_fit",
    "dash": "dashboards.cli_dash",
    "ingest": "tracing.cli_ingest",
    "ranges": "tracing.cli_ranges",
    "annotate": "tracing.cli_annotate",
}


def _available_commands() -> dict[str, str]:
    return {name: mod for name, mod in COMMANDS.items() if importlib.util.find_spec(mod) is not None}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mxperf",
        description="Profile BF16 vs MXFP8 RL runs, fit the breakeven micro-batch size, check weight syncs.",
    )
    parser.add_argument("--version", action="version", version=f"mxperf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod_name in _available_commands().items():
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
    from tracing.store import use_system_allocator

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
    from tracing.errors import MxperfError

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
