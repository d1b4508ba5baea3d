"""The flags of the commands that train or generate (``run``, ``sweep``, ``consistency``, ``faults``,
``pretrain``), in one place: ``--device``, ``--threads``, ``--gemm`` and ``--weight-cast``.

``--gemm`` and ``--weight-cast`` apply where a learner runs. Values are checked before any work starts (one line, exit 2)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from tracing.outputs.errors import InputError

# argparse reads "-128,256" as an unknown option; a parser that takes lists of numbers accepts it as a value
# (and the config then says what is wrong with a negative size).
_NEGATIVE_LIST = re.compile(r"^-\d[\d.,]*$")


def add_device_arguments(p: argparse.ArgumentParser, *, learner: bool = True) -> None:
    p.add_argument(
        "--device",
        default="auto",
        help="auto | cpu | cuda | cuda:N: where the learner (and the native sampler) run (auto: the first GPU "
        "if there is one, else the CPU)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady timings)")
    if learner:
        p.add_argument(
            "--gemm",
            default="auto",
            help="auto | emulated | scaled_mm: low-precision GEMMs through torch._scaled_mm where the device "
            "has the kernel (auto), always emulated with the exact bytes, or the real kernel or an error",
        )
        p.add_argument(
            "--weight-cast",
            default="per-step",
            help="per-step (weights cast once per optimizer step, in micro-batch 0; TE is_first_microbatch) | "
            "per-microbatch (recast every micro-batch)",
        )


def accept_negative_lists(p: argparse.ArgumentParser) -> None:
    """Let values such as ``-128,256`` reach the command (argparse would call them an unknown option)."""
    if hasattr(p, "_negative_number_matcher"):
        p._negative_number_matcher = _NEGATIVE_LIST


def device_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Validate ``--threads`` and ``--device``, set torch's thread count; returns the config fields
    (``device`` and, where present, ``gemm`` / ``weight_cast``)."""
    import torch

    from pipeline.device import resolve_device

    threads = args.threads
    if not 1 <= threads <= 4096:
        raise InputError(f"--threads must be from 1 to 4096, got {threads}")
    resolve_device(args.device)  # DeviceUnavailableError: one line naming what this machine has
    torch.set_num_threads(threads)
    out: dict[str, Any] = {"device": args.device}
    for name in ("gemm", "weight_cast"):
        if hasattr(args, name):
            out[name] = getattr(args, name)
    return out
