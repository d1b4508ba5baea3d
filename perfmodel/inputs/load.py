"""Everything ``mxperf fit`` can read, turned into one micro-batch table (``tracing.outputs.schema.MICROBATCH_COLUMNS``).

What each input can and cannot give:

- **sweep directory** (manifest kind ``sweep``): ``microbatches.parquet`` with every size, precision and repeat
  -> fits, breakeven, hold-out accuracy; host stall and GPU busy only when the sweep ran with ``--trace`` on
  a GPU; memory per token from ``peak_mem_bytes``.
- **labelled ingest directory** (kind ``ingest``, made with ``mxperf ingest ... --label model=M,precision=P,
  tokens_per_microbatch=N``): the micro-batches of *one* trace -> per-range times and host stall at one size.
  A breakeven needs at least two sizes per precision, so pass several labelled ingests together. Its
  ``kernels.parquet`` (kernel classes) also sizes the quantize work for ``--what-if weight_quant=per_step``.
  Its ``steps.parquet`` (traced steps, or a verl / NeMo RL metric log) is a per-precision phase source for the
  step model (:mod:`perfmodel.inputs.ingest_steps`), with or without micro-batches; a metric log of an async
  trainer says its steps ran with a separate sampler (:mod:`perfmodel.inputs.placement`). An ingest with
  neither is refused with the fix.
- **run directory** (kind ``run``): one step per row in ``metrics.parquet`` -> the per-step seconds of every
  phase (generate, logprob, update, sync, ...) of *its* precisions (generate and sync: the sampler's, the
  others: the learner's; :class:`RunFolder`), its model and its settings (tokens per step, per micro-batch)
  for the step model (:mod:`perfmodel.step.model`). It cannot give a fit by itself.
- **CSV or Parquet** with ``model, precision, tokens_per_microbatch, seconds`` (optional: every other column
  of the micro-batch table, ``global_tokens``, ``seq_lens``; others are ignored with a note), e.g. a GPU
  sweep's own ``microbatches.csv``: measurements taken elsewhere. Without ``repeat``/``step`` the bootstrap
  resamples single micro-batches; without host stall and GPU busy there is no stall share and no GPU-busy
  breakeven. Column handling: :mod:`perfmodel.inputs.columns`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.inputs.columns import conform_microbatches
from perfmodel.inputs.hardware import hardware_of
from perfmodel.inputs.ingest_steps import phase_sources
from perfmodel.inputs.placement import separate_sampler_logs
from perfmodel.inputs.run_folder import SAMPLER_PHASES, RunFolder, attrs_of, read_ranges
from tracing.analysis.steps import metric_seconds
from tracing.outputs import store
from tracing.outputs.errors import InputError
from tracing.outputs.manifest import read_manifest
from tracing.outputs.precisions import PRECISION_IDS

__all__ = [
    "SAMPLER_PHASES",
    "FitInputs",
    "InputSummary",
    "RunFolder",
    "check_fittable",
    "conform_microbatches",
    "load_inputs",
    "read_run_folder",
]
TRACE_SOURCES = ("trace", "range", "detected")  # micro-batches read from a trace (old and v2 names)
STEP_PHASES = ("generate", "logprob", "sync", "reward", "eval", "reference")


@dataclass(frozen=True)
class InputSummary:
    path: str
    kind: str
    rows: int
    gives: str
    cannot_give: str
    machine: str = "-"


@dataclass
class FitInputs:
    """The loaded inputs: one micro-batch table plus optional step-level and kernel information."""

    microbatches: pd.DataFrame
    other_phases_s: dict[str, float] = field(default_factory=dict)
    kernels: pd.DataFrame | None = None
    kernel_microbatches: dict[str, int] = field(default_factory=dict)  # precision -> micro-batches traced
    summaries: list[InputSummary] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # columns ignored, values left out: said in the report
    emulated: dict[str, str] = field(default_factory=dict)  # precision -> how its GEMMs were emulated
    runs: list[RunFolder] = field(default_factory=list)  # run folders: per-precision phase times
    phase_times: dict[tuple[str, str], float] = field(default_factory=dict)  # (precision, phase) -> s
    separate_sampler: dict[str, str] = field(default_factory=dict)  # phase source path -> why (placement)
    load_warnings: list[str] = field(
        default_factory=list
    )  # inputs measured on a machine busier than its cores
    no_microbatches: list[str] = field(default_factory=list)  # ingests giving phase times only: why no fit
    fit_hardware: dict[str, str | None] = field(default_factory=dict)  # micro-batch input -> its device
    phase_hardware: dict[str, str | None] = field(default_factory=dict)  # phase source -> its device


def load_warning(path: Path | str, manifest: dict) -> str | None:
    """A sweep's or run's recorded machine load (manifest ``load``: start and end samples) above its CPU count,
    in words; None when it stayed within the cores or was not recorded."""
    load = manifest.get("load")
    if not isinstance(load, dict):
        return None
    over = []
    for when in ("start", "end"):
        s = load.get(when) or {}
        avg, cpus = s.get("loadavg"), s.get("cpu_count")
        if avg and cpus and float(avg[0]) > float(cpus):
            over.append(f"{float(avg[0]):.1f} at the {when}")
    if not over:
        return None
    cpus = (load.get("start") or load.get("end") or {}).get("cpu_count")
    return (
        f"{path} ran on a machine busier than its {cpus} cores (1-minute load average {' and '.join(over)}): "
        "its timings include other work's; re-measure on an idle machine before trusting a small difference"
    )


def read_csv_table(path: Path, notes: list[str] | None = None) -> pd.DataFrame:
    """A user CSV of micro-batch measurements (see the module docstring for the columns)."""
    if path.stat().st_size == 0:
        raise InputError(f"{path}: empty file")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a readable CSV ({exc})") from None
    return conform_microbatches(df, str(path), "csv", notes)


def _phase_seconds(metrics: pd.DataFrame) -> dict[str, pd.Series]:
    """Seconds per step of each phase of a run's ``metrics.parquet`` (NaN where a step does not say)."""
    return metric_seconds(metrics, (*STEP_PHASES, "update"))


def _metrics(path: Path) -> pd.DataFrame:
    if not (path / store.METRICS).is_file():
        raise InputError(
            f"{path}: a run directory without per-step metrics (e.g. `mxperf consistency` or `mxperf faults` "
            "output); fit reads sweeps, labelled ingests and `mxperf run` directories"
        )
    return store.read_table(path / store.METRICS)


def _microbatch_tokens(path: Path) -> dict[int, tuple[int, ...]]:
    """Per learner step, the padded tokens of each update micro-batch in order (``update/microbatch``
    ranges of the run's ``ranges.parquet``: what the learner computed on); empty without that table."""

    ranges = read_ranges(path)
    if ranges is None:
        return {}
    out: dict[int, list[tuple[int, int]]] = {}
    for raw in ranges.loc[ranges["name"] == "update/microbatch", "attrs"]:
        a = attrs_of(raw)
        try:
            step, idx = int(a["step"]), int(a["microbatch"])
            tokens = int(a.get("padded_tokens") or a["tokens"])
        except (TypeError, ValueError, KeyError):
            continue
        out.setdefault(step, []).append((idx, tokens))
    return {s: tuple(t for _, t in sorted(v)) for s, v in out.items()}


def read_run_folder(path: Path, manifest: dict) -> RunFolder:
    """A run folder's per-step phase seconds, model, precisions and settings (from its manifest's config)."""
    metrics = _metrics(path)
    cfg = manifest.get("config") or {}
    phases = {p: [float(v) for v in s.dropna()] for p, s in _phase_seconds(metrics).items()}
    tokens = pd.to_numeric(metrics.get("update_tokens", pd.Series(dtype=float)), errors="coerce").dropna()
    tpm = cfg.get("tokens_per_microbatch")
    step_ids = pd.to_numeric(metrics.get("step", pd.Series(range(len(metrics)), index=metrics.index)))
    packed = _microbatch_tokens(path)
    steps = pd.DataFrame(
        {
            "step": step_ids,
            "microbatch_tokens": [packed.get(int(s)) if pd.notna(s) else None for s in step_ids],
            "step_s": metric_seconds(metrics, ("step",)).get("step", pd.Series(np.nan, index=metrics.index)),
            "num_microbatches": pd.to_numeric(
                metrics.get("num_microbatches", pd.Series(np.nan, index=metrics.index)), errors="coerce"
            ),
            "update_tokens": pd.to_numeric(
                metrics.get("update_tokens", pd.Series(np.nan, index=metrics.index)), errors="coerce"
            ),
            **{f"{p}_s": s for p, s in _phase_seconds(metrics).items()},
        }
    )
    return RunFolder(
        path=str(path),
        model=str(cfg["model"]) if cfg.get("model") else None,
        learner=str(cfg["learner"]) if cfg.get("learner") else None,
        sampler=str(cfg.get("sampler") or cfg.get("learner"))
        if (cfg.get("sampler") or cfg.get("learner"))
        else None,
        phases={p: v for p, v in phases.items() if v},
        global_tokens=float(tokens.median()) if len(tokens) else None,
        tokens_per_microbatch=float(tpm) if tpm else None,
        steps=steps,
    )


def _load_dir(path: Path, inputs: FitInputs, tables: list[pd.DataFrame]) -> None:
    manifest = read_manifest(path)
    kind, status = manifest["kind"], manifest["status"]
    if status != "complete":
        raise InputError(
            f"{path}: {kind} directory has status '{status}', not 'complete'; re-run it or pass another"
        )
    mb_path = path / store.MICROBATCHES
    if kind in ("run", "sweep") and (warn := load_warning(path, manifest)):
        inputs.load_warnings.append(warn)
    if kind == "run":
        run = read_run_folder(path, manifest)
        inputs.runs.append(run)
        inputs.phase_hardware[run.path] = hardware_of(manifest, kind)
        precs = (
            run.learner
            if run.learner == run.sampler
            else f"learner {run.learner or '?'}, sampler {run.sampler or '?'}"
        )
        inputs.summaries.append(
            InputSummary(
                str(path),
                "run",
                0,
                f"per-step seconds of {', '.join(run.phases) or 'no'} phases of {run.model or 'an unnamed model'} "
                f"in {precs}",
                "micro-batch fits (a run has one micro-batch size)",
            )
        )
        return
    if kind == "demo":
        raise InputError(f"{path}: an mxperf demo folder; fit its sweep: mxperf fit {path / 'sweep'}")
    if kind not in ("sweep", "ingest"):
        raise InputError(
            f"{path}: a '{kind}' directory has no micro-batch measurements; pass a sweep or ingest"
        )
    if kind == "ingest":
        sources, left_out = phase_sources(path, manifest)
        inputs.runs.extend(sources)
        inputs.phase_hardware.update({s.path: hardware_of(manifest, kind) for s in sources})
        async_logs = separate_sampler_logs(manifest)
        inputs.separate_sampler.update(
            {s.path: async_logs[s.learner] for s in sources if s.learner in async_logs}
        )
        inputs.notes.extend(left_out)
        if sources and not mb_path.is_file():
            inputs.no_microbatches.append(_no_microbatches(path, manifest))
            for src in sources:
                inputs.summaries.append(
                    InputSummary(
                        src.path,
                        "ingest",
                        0,
                        f"per-step seconds of {', '.join(src.phases)} of "
                        f"{src.model or 'an unnamed model'} in {src.learner} (its step table)",
                        "micro-batch fits (no micro-batches in its traces)",
                    )
                )
            return
    if not mb_path.is_file():
        if kind == "ingest":
            raise InputError(_no_microbatches(path, manifest))
        raise InputError(f"{path}: sweep directory has no {store.MICROBATCHES}")
    raw = store.read_table(mb_path)
    df = conform_microbatches(raw, str(mb_path), "sweep" if kind == "sweep" else "range", inputs.notes)
    inputs.fit_hardware[str(path)] = hardware_of(manifest, kind)
    tables.append(df)
    stall = df["host_stall_seconds"].notna().any()
    sizes = df["tokens_per_microbatch"].nunique()
    gives = f"{len(df)} micro-batches at {sizes} size(s)" + (", host stall" if stall else "")
    cannot = "" if stall else "host stall (no GPU trace, or none of its launch calls)"
    if kind == "ingest":
        cannot = "; ".join(
            x for x in (cannot, "a breakeven alone (one size); combine ingests of >= 2 sizes") if x
        )
        kpath = path / store.KERNELS
        if kpath.is_file():
            _add_kernels(inputs, store.read_table(kpath), df)
    m = manifest.get("machine") or {}
    machine = f"{m.get('cpu', '?')} x{m.get('cpu_count', '?')}; GPU {m.get('gpu') or 'none'}" if m else "-"
    device = manifest.get("learner_device") or (manifest.get("config") or {}).get("learner_device")
    if kind == "sweep" and device:
        machine += f"; learner on {device}"
    if kind == "ingest":  # the numbers come from the traced machine, not from the one that ingested them
        machine = f"{_traced_on(manifest)} (ingested on {machine})"
    for prec, why in emulated_precisions(manifest, kind, df).items():
        inputs.emulated.setdefault(prec, why)
    inputs.summaries.append(InputSummary(str(path), kind, len(df), gives, cannot or "-", machine))


def _no_microbatches(path: Path, manifest: dict) -> str:
    """Why an ingest has no micro-batch table, with the fix (``mxperf ingest`` said it per trace and phase:
    the manifest's ``microbatch_notes``)."""
    labels = (manifest.get("config") or {}).get("labels")
    labelled = f" is labelled ({', '.join(f'{k}={v}' for k, v in labels.items())}) but" if labels else ""
    notes = manifest.get("traces") or []
    why = [p for t in notes for n in t.get("microbatch_notes") or [] for p in n["problems"]]
    why = why or ["no update / logprob / reward range with forward passes, no micro-batch ranges"]
    return (
        f"{path}: ingest directory{labelled} has no {store.MICROBATCHES}: no micro-batches were found in "
        f"its traces ({'; '.join(why[:3])}); "
        "labels fill what a trace cannot say (--label model=M,precision=P,tokens_per_microbatch=N); "
        "capture settings: docs/tracing.md, 'Fit your own run'"
    )


def _traced_on(manifest: dict) -> str:
    """Where an ingest's traces ran: the GPU(s) they name, a GPU they do not name, or no GPU at all."""
    traces = manifest.get("traces") or []
    names = sorted({n for t in traces for n in t.get("gpu_names") or []})
    if names:
        return f"traced on {', '.join(names)}"
    if any(t.get("devices") for t in traces):
        return "traced on a GPU not named in the trace"
    if traces:
        return "a CPU-only trace (no GPU ops)"
    return "traced on a device the manifest does not record"


def emulated_precisions(manifest: dict, kind: str, df: pd.DataFrame) -> dict[str, str]:
    """Low precisions of an input whose GEMMs were emulated (quantize/dequantize around higher-precision
    GEMMs), with how we know: the sweep's or run's recorded ``gemm_backend``; else a learner on the CPU (no
    low-precision GEMMs there); else an ingest of CPU-only traces."""
    low = sorted(set(df["precision"].astype(str)) - {"bf16"})
    out: dict[str, str] = {}
    learners = manifest.get("learners") if isinstance(manifest.get("learners"), dict) else {}
    engines = manifest.get("engines") if isinstance(manifest.get("engines"), dict) else {}
    if isinstance(engines.get("learner"), dict) and engines["learner"].get("precision"):
        learners = {**learners, str(engines["learner"]["precision"]): engines["learner"]}
    device = manifest.get("learner_device") or (manifest.get("config") or {}).get("learner_device")
    for prec in low:
        info = learners.get(prec)
        if isinstance(info, dict) and info.get("gemm_backend"):
            if info["gemm_backend"] == "emulated":
                where = info.get("learner_device") or device or "this device"
                out[prec] = (
                    f"emulated on {where} (gemm_backend: emulated; {info.get('gemm_reason') or 'recorded'})"
                )
            continue
        gpu = (manifest.get("machine") or {}).get("gpu")
        if kind in ("sweep", "run") and (device == "cpu" or (device is None and not gpu)):
            out[prec] = "emulated on the CPU (a CPU run has no low-precision GEMMs)"
        elif kind == "ingest" and _traced_on(manifest) == "a CPU-only trace (no GPU ops)":
            out[prec] = "emulated on the CPU (CPU-only traces: no low-precision GEMMs)"
    return out


def _add_kernels(inputs: FitInputs, kernels: pd.DataFrame, mb: pd.DataFrame) -> None:
    """Kernel totals of one ingest, each trace's under the precision of its micro-batches, and how many
    micro-batches per precision they cover (one ingest may hold traces of several precisions)."""
    if "trace" in mb.columns and mb["trace"].notna().any() and "trace" in kernels.columns:
        precision_of = mb.groupby("trace")["precision"].first().astype(str)
        kernels = kernels.assign(precision=kernels["trace"].map(precision_of))
        kernels = kernels[kernels["precision"].notna()]  # traces with no labelled micro-batch
    elif mb["precision"].nunique() == 1:  # an ingest written before micro-batches named their trace
        kernels = kernels.assign(precision=str(mb["precision"].iloc[0]))
    else:
        return  # several precisions and no way to tell whose kernels are whose
    inputs.kernels = (
        kernels if inputs.kernels is None else pd.concat([inputs.kernels, kernels], ignore_index=True)
    )
    update = mb[mb["phase"] == "update"]
    counted = update if len(update) else mb
    for prec, n in counted["precision"].astype(str).value_counts().items():
        inputs.kernel_microbatches[prec] = inputs.kernel_microbatches.get(prec, 0) + int(n)


def _read_parquet(path: Path) -> pd.DataFrame:
    """A micro-batch table in Parquet, written by mxperf or by any other tool."""
    return store.read_table(path, foreign=True)


def load_inputs(paths: list[str | Path]) -> FitInputs:
    """Read every input path (directory, CSV or microbatches.parquet) into one validated micro-batch table."""
    inputs = FitInputs(microbatches=pd.DataFrame())
    tables: list[pd.DataFrame] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        if path.is_dir():
            _load_dir(path, inputs, tables)
        elif path.suffix.lower() == ".csv":
            df = read_csv_table(path, inputs.notes)
            tables.append(df)
            stall = df["host_stall_seconds"].notna().any()
            inputs.summaries.append(
                InputSummary(
                    str(path), "csv", len(df), f"{len(df)} micro-batches", "-" if stall else "host stall"
                )
            )
        elif path.suffix.lower() == ".parquet":
            tables.append(conform_microbatches(_read_parquet(path), str(path), "sweep", inputs.notes))
            inputs.summaries.append(InputSummary(str(path), "parquet", len(tables[-1]), "micro-batches", "-"))
        else:
            raise InputError(
                f"{path}: expected a sweep/ingest/run directory, a .csv or a microbatches.parquet"
            )
    if not tables:
        if inputs.no_microbatches:  # ingests that give phase times only: say why they give no fit
            raise InputError(
                "; ".join(inputs.no_microbatches)
                + " (its step table gives phase times for the step model, not a micro-batch fit: add a sweep, "
                "an ingest with micro-batches or a CSV)"
            )
        raise InputError(
            "no micro-batch measurements among the inputs (a run directory alone cannot be fitted)"
        )
    inputs.microbatches = pd.concat(tables, ignore_index=True)
    return inputs


def check_fittable(mb: pd.DataFrame, baseline: str, min_tokens: int = 0) -> None:
    """Raise InputError naming what is missing for a comparison against ``baseline``."""
    if baseline not in PRECISION_IDS:
        raise InputError(f"--baseline {baseline!r} is not a precision id ({', '.join(PRECISION_IDS)})")
    if min_tokens > 0:
        mb = mb[mb["tokens_per_microbatch"] >= min_tokens]
        if mb.empty:
            raise InputError(f"no micro-batches with at least --min-tokens {min_tokens} tokens")
    problems = []
    for (model, phase), g in mb.groupby(["model", "phase"], sort=True):
        precs = sorted(g["precision"].unique())
        if baseline not in precs:
            problems.append(f"{model}/{phase}: no {baseline} baseline (has {', '.join(precs)})")
        elif len(precs) < 2:
            problems.append(f"{model}/{phase}: only one precision ({precs[0]}); need {baseline} and another")
        for prec, gp in g.groupby("precision"):
            sizes = sorted(gp["tokens_per_microbatch"].unique())
            if len(sizes) < 2 and gp["num_tokens"].nunique() >= 2:
                continue  # dynamic batching: one budget, micro-batches of several actual sizes
            if len(sizes) < 2:
                problems.append(
                    f"{model}/{phase}/{prec}: {len(sizes)} micro-batch size ({sizes[0]}); a fit needs >= 2"
                    + (f" at or above --min-tokens {min_tokens}" if min_tokens else "")
                    + (
                        " (one labelled trace is one size: ingest traces of >= 2 sizes)"
                        if gp["source"].isin(TRACE_SOURCES).all()
                        else ""
                    )
                )
    if problems:
        raise InputError("cannot fit: " + "; ".join(problems))
