"""``mxperf fit``: fixed + per-token fits, breakeven against a baseline, host-stall share, step predictions.

    mxperf fit SWEEP_DIR [INGEST_DIR... RUN_DIR... FILE.csv...] -o OUT/ [--json] [--baseline bf16] [--force]
               [--min-tokens N] [--global-batch N] [--at N,n[,G]]... [--mem-cap-bytes B] [--what-if k=v]...
               [--other-phase k=s]... [--phase PHASE | --phase PRECISION:PHASE=SECONDS]...
               [--placement colocated|separate]

Writes OUT/fits.json, OUT/report.md and PNG plots (manifest kind "fit"), prints one verdict per comparison,
and with ``--json`` ends stdout with the fits.json document on one line. Inputs are validated before the
output directory is touched, so bad input never leaves (or overwrites) a report.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from tracing.outputs.placement import FORCE_HELP, OUT_HELP


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mxperf.commands.kernels import add_bounds_arguments

    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="sweep / labelled ingest / run directories, CSV files, microbatches.parquet",
    )
    parser.add_argument("-o", "--out", required=True, type=Path, help=OUT_HELP)
    parser.add_argument("--json", action="store_true", help="print fits.json as the last stdout line")
    parser.add_argument("--baseline", default="bf16", help="precision id to compare against (default bf16)")
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)
    parser.add_argument(
        "--min-tokens",
        type=int,
        default=0,
        metavar="N",
        help="fit only micro-batch sizes >= N tokens (drop an under-filled small end)",
    )
    parser.add_argument(
        "--global-batch",
        type=int,
        default=None,
        metavar="N",
        help="tokens per step for step-level predictions (default: from the data)",
    )
    parser.add_argument(
        "--at",
        action="append",
        default=[],
        metavar="N,n[,G]",
        help="your settings: N tokens per step in micro-batches of n tokens (G of them generated: a generation "
        "term fitted on prompt and generated tokens scales with it, else with the runs' share); the step "
        "time per precision and the gain with 95 %% intervals (repeatable; or several separated by ';')",
    )
    parser.add_argument(
        "--mem-cap-bytes",
        type=float,
        default=None,
        metavar="B",
        help="peak memory cap per micro-batch for the recommendation",
    )
    parser.add_argument(
        "--what-if",
        action="append",
        default=[],
        metavar="K=V",
        help="fixed_scale=S | weight_quant=per_step | weight_quant_s=SECONDS (repeatable)",
    )
    parser.add_argument(
        "--other-phase",
        action="append",
        default=[],
        metavar="PHASE=SECONDS",
        help="seconds per step of a phase that does not scale with n (e.g. generate=1.2)",
    )
    parser.add_argument(
        "--phase",
        action="append",
        default=None,
        metavar="PHASE | PRECISION:PHASE=SECONDS",
        help="a phase name: fit only these phases; PRECISION:PHASE=SECONDS: that precision's seconds per step "
        "of a phase in the step model, e.g. mxfp8:generate=1.2 (repeatable)",
    )
    parser.add_argument(
        "--placement",
        default=None,
        metavar="colocated|separate",
        help="how the step's phases add up. colocated: sampler and learner share the GPUs (hybrid engine, "
        "verl's default), step = sum of the phases. separate: the sampler has its own GPUs and generates the "
        "next batch while the learner works (verl one-step-off-policy, NeMo RL async GRPO, disaggregated "
        "vLLM), step = max(generate, learner phases) + sync. Default: separate where an input is an async "
        "trainer's metric log, else colocated; the output names the placement and where it came from",
    )
    parser.add_argument(
        "--bootstrap", type=int, default=1000, metavar="B", help="bootstrap resamples (default 1000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--device", metavar="NAME", help="with --model-shape: the terms next to its floors")
    add_bounds_arguments(parser)  # --model-shape (mxperf.commands.kernels, perfmodel.kernels.bounds)


MIN_BOOTSTRAP = 20  # fewer resamples put the 2.5 / 97.5 % percentiles on one or two replicates
MAX_BOOTSTRAP = 100_000


def _other_phases(items: list[str]) -> dict[str, float]:
    from tracing.outputs.errors import InputError

    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise InputError(f"--other-phase {item!r}: expected PHASE=SECONDS") from None
        if not sep or not name.strip() or not math.isfinite(out[name.strip()]) or out[name.strip()] < 0:
            raise InputError(f"--other-phase {item!r}: expected PHASE=SECONDS with SECONDS a number >= 0")
    return out


def _check_args(args: argparse.Namespace) -> None:
    from perfmodel.step.overlap import parse_placement
    from tracing.outputs.errors import InputError
    from tracing.outputs.placement import check_target

    if args.min_tokens < 0:
        raise InputError(f"--min-tokens {args.min_tokens}: must be >= 0 (0 fits every size)")
    if args.bootstrap < 0:
        raise InputError(f"--bootstrap {args.bootstrap}: must be >= 0 resamples")
    if 0 < args.bootstrap < MIN_BOOTSTRAP:  # 1 resample gave "slower (95 % CI -250 to -250 %)"
        raise InputError(
            f"--bootstrap {args.bootstrap}: a 95 % interval needs at least {MIN_BOOTSTRAP} resamples "
            "(0: no intervals, and the answer says so)"
        )
    if args.bootstrap > MAX_BOOTSTRAP:  # 1e20 failed in numpy: "Maximum allowed dimension exceeded"
        raise InputError(f"--bootstrap {args.bootstrap}: at most {MAX_BOOTSTRAP:,} resamples")
    if args.seed < 0:  # numpy's "expected non-negative integer" named no flag
        raise InputError(f"--seed {args.seed}: must be >= 0")
    if args.global_batch is not None and args.global_batch <= 0:
        raise InputError("--global-batch must be a positive number of tokens")
    if args.global_batch is not None and args.global_batch >= 2**53:  # 1e23 was a traceback (log10 of an int)
        raise InputError(
            f"--global-batch {args.global_batch}: 2**53 tokens or more; give a step's token count"
        )
    if args.mem_cap_bytes is not None and not (math.isfinite(args.mem_cap_bytes) and args.mem_cap_bytes > 0):
        raise InputError(f"--mem-cap-bytes {args.mem_cap_bytes:g}: must be a positive finite number of bytes")
    parse_placement(args.placement)
    check_target(args.out, kind="fit", force=args.force, inputs=args.inputs)


def _write_plots(doc: dict, out: Path) -> dict[str, dict[str, str]]:
    from perfmodel.report import plots

    written: dict[str, dict[str, str]] = {}
    for e in doc["models"]:
        stem = plots.plot_stem(e)
        figs = {
            "time vs tokens per micro-batch": ("time_vs_tokens", plots.time_vs_tokens_figure(e)),
            "GPU busy time vs tokens (host overhead removed)": ("gpu_busy", plots.gpu_busy_figure(e)),
            "host-stall fraction vs tokens": ("host_stall", plots.host_stall_figure(e)),
            "predicted step time": ("step_time", plots.step_time_figure(e, doc["global_batch_tokens"])),
        }
        for title, (kind, fig) in figs.items():
            if fig is None:
                continue
            name = f"{kind}_{stem}.png"
            tmp = out / f".{name}.tmp.png"
            fig.savefig(tmp)
            plots.close(fig)
            tmp.replace(out / name)
            written.setdefault(stem, {})[title] = name
    return written


def run(args: argparse.Namespace) -> int:
    from mxperf.commands.kernels import bounds_lines, bounds_setup
    from perfmodel.inputs.load import check_fittable, load_inputs
    from perfmodel.report.headline import setting_words
    from perfmodel.report.markdown import render_report
    from perfmodel.report.results import analyze
    from perfmodel.step.costs import parse_what_if
    from perfmodel.step.model import parse_at, parse_phase_flags
    from perfmodel.step.validation import validation_lines
    from perfmodel.step.whatifs import what_if_lines
    from tracing.outputs import store
    from tracing.outputs.manifest import OutputDir

    _check_args(args)
    bounds = bounds_setup(args)
    knobs = parse_what_if(args.what_if)
    other = _other_phases(args.other_phase)
    phase_times, fit_phases = parse_phase_flags(args.phase or [])
    at = parse_at(args.at)
    inputs = load_inputs(args.inputs)
    if fit_phases:
        inputs.microbatches = inputs.microbatches[inputs.microbatches["phase"].isin(fit_phases)]
        if inputs.microbatches.empty:
            from tracing.outputs.errors import InputError

            raise InputError(f"--phase: no micro-batches in phase(s) {', '.join(fit_phases)}")
    inputs.other_phases_s.update(other)
    inputs.phase_times.update(phase_times)
    check_fittable(inputs.microbatches, args.baseline, args.min_tokens)
    doc = analyze(
        inputs,
        baseline=args.baseline,
        min_tokens=args.min_tokens,
        n_boot=args.bootstrap,
        seed=args.seed,
        global_tokens=args.global_batch,
        mem_cap_bytes=args.mem_cap_bytes,
        knobs=knobs,
        at=at,
        floors_setup=bounds,
        placement=args.placement,
    )
    config = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if not k.startswith("_")
    }
    with OutputDir(args.out, kind="fit", config=config, force=args.force, inputs=args.inputs) as od:
        store.write_json(doc, od.path / store.FITS)
        plots = _write_plots(doc, od.path)
        store.write_text(render_report(doc, plots), od.path / store.REPORT)
        od.update(models=len(doc["models"]), plots=sorted(p for v in plots.values() for p in v.values()))
    stream = sys.stdout
    for note in doc.get("notes") or []:
        print(f"note: {note}", file=sys.stderr)
    for line in doc.get("answer") or []:  # the three-line answer per comparison first, then the details
        print(line, file=stream)
    for sm in doc.get("step_model") or []:
        for s in (sm.get("settings") or [])[1:]:  # the first setting is the answer's
            print(setting_words(sm, s), file=stream)
    for sm in doc.get("step_model") or []:  # predicted vs measured, per run folder, phase and whole step
        for line in validation_lines(sm.get("validation")):
            print(line, file=stream)
    for e in doc["models"]:
        print(e["verdict"], file=stream)
    for sm in doc.get("step_model") or []:  # the what-ifs at the answer's setting, with intervals
        for line in what_if_lines(sm):
            print(line, file=stream)
    for line in bounds_lines(doc, bounds) if bounds else []:
        print(line, file=stream)
    print(f"wrote {args.out / store.FITS} and {args.out / store.REPORT}", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, allow_nan=False, separators=(",", ":")), file=stream)
    return 0
