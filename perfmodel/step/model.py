"""The whole RL step per precision: how much faster is a step with the low precision, at the user's settings.

One step of precision ``p`` over ``N`` tokens in micro-batches of ``n`` tokens::

    step_p(N, n) = sum over phases X of  t_p,X(N, n)                      (a colocated sampler, the default)
                 = max(t_p,generate, sum of the learner's t_p,X) + t_p,sync  (a separate sampler)
    t_p,X(N, n)  = (k - 1) * mb_p,X(n) + mb_p,X(N - (k - 1) n) + per_step_p,X,   k = ceil(N / n)
                   (a micro-batched phase with a fit: update, logprob, ...; the last micro-batch holds the rest)
                   + opt_p for the update: its time outside the micro-batches (optimizer step), once per step
    t_p,X        = the phase's measured seconds per step                        (any other phase)

The placement (:mod:`perfmodel.step.overlap`: which phases overlap, and the sources read) is
``--placement``, else ``separate`` where an input is an async trainer's metric log
(:mod:`perfmodel.inputs.placement`), else ``colocated``; one rule serves the point estimates, every replicate
(the max per replicate), the breakeven scan, the recommendation and the validation. Such a log's wait for
the sampler (phase ``generate_wait``) is no term: the max accounts for it. Where a source of the sampler's
precision logs that wait but no generation time (NeMo RL async) and nothing else gives generate, a separate
step stops the answer and the reason names the fix (``--phase P:generate=S``).

Every term is the precision's own: a fitted phase from that precision's micro-batch fit (the model the data
chose: a line or a knee curve, plus its per-step cost); another phase from, in order, ``--phase p:X=S``,
``--other-phase X=S`` (the same for every precision, as the user said), or the median over the steps of the
run folders that ran ``X`` in ``p`` (generate and sync: the sampler's precision; the others: the learner's).
Run folders of one precision are pooled (sorted, so the order of the inputs never changes the answer); a
run folder of a model that was not fitted is refused. A phase known for one precision only stops the answer
(the step would be compared over different phases); measured phase times are held at the value measured at
the run's own global batch (``scaled: false``).

Intervals: percentile intervals over replicates drawn together -- each fit's unit-bootstrap replicates (its
curve and per-step cost, ``BasisFit.boot_curve`` / ``per_step_boot``) and a bootstrap of the median over
the run's steps for measured phases (the fits of different precisions and phases are independent, so their
replicates pair by index). The gain ``1 - step_low / step_base`` and its interval; the breakeven micro-batch
size of the whole step at ``N`` (a scan over ``n``, the same scan on every replicate); the recommendation:
per precision the fastest measured size that fits the memory cap and ``N`` (a larger, faster size beyond
the measured ones is said, marked extrapolated), named only when its gain's interval excludes zero.

``opt_p`` (:mod:`perfmodel.step.optimizer`): the median per step of the run folders' ``update`` ranges minus
their ``update/microbatch`` ranges (a sweep's micro-batches never hold it), with a bootstrap of that median
in the replicates; absent (and said) when no run folder of ``p`` records those ranges, or when only one
precision has it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from perfmodel.fitting.bootstrap import interval as _ci
from perfmodel.fitting.bootstrap import median_replicates, percentile_ci
from perfmodel.fitting.fitted import PrecisionFit
from perfmodel.fitting.model import LEVEL
from perfmodel.inputs.load import RunFolder
from perfmodel.step.generation import PHASE as GEN_PHASE
from perfmodel.step.generation import GenerationFit, generation_fits
from perfmodel.step.optimizer import PHASE as OUTSIDE_PHASE
from perfmodel.step.optimizer import OptimizerTerm, optimizer_terms
from perfmodel.step.overlap import COLOCATED, NOT_TERMS, SEPARATE, Placement, choose, combine, overlap_entry
from perfmodel.step.overlap import gain_by_phase as _gain_by_phase
from perfmodel.step.overlap import learner_weight as _learner_weight
from perfmodel.step.recommend import NO_GLOBAL_BATCH, default_global_tokens, max_tokens_under_cap
from perfmodel.step.validation import validate_runs
from tracing.outputs.errors import InputError

PHASE_ORDER = ("generate", "reference", "logprob", "update", "sync", "reward", "eval")
SCAN_POINTS = 160  # micro-batch sizes scanned for the whole-step breakeven


@dataclass(frozen=True)
class PhaseTerm:
    """One phase of one precision's step: ``fitted`` (a micro-batch fit), ``measured`` (run folders' steps)
    or ``given`` (a flag)."""

    phase: str
    kind: str
    source: str
    fit: PrecisionFit | None = None
    samples: tuple[float, ...] = ()  # measured: seconds per step, sorted
    seconds: float | None = None  # measured (median) or given
    at_global_tokens: float | None = None  # measured: the runs' tokens per step
    runs: tuple[str, ...] = ()  # measured: the run folders it is the median of
    outside: OptimizerTerm | None = None  # fitted update: its per-step time outside the micro-batches
    gen: GenerationFit | None = None  # measured generate: prefill + decode fit (used, or why not)

    @property
    def outside_s(self) -> float:
        """Seconds added once per step besides the micro-batches (the optimizer step; 0 when absent)."""
        return float(self.outside.seconds or 0.0) if self.outside is not None else 0.0

    @property
    def scaled(self) -> bool:
        """A generate term fitted on prompt and generated tokens (scales with N)."""
        return self.gen is not None and self.gen.used

    def point(
        self,
        big_n: float,
        n: float,
        packing: Sequence[float] | None = None,
        generated: float | None = None,
    ) -> float:
        if self.scaled:
            return self.gen.seconds(big_n, generated)  # type: ignore[union-attr]
        if self.fit is None:
            return float(self.seconds)  # type: ignore[arg-type]
        curve, per_step = self.fit.wall.curve(), self.fit.per_step_s
        return float(_microbatched(curve, per_step, big_n, n, packing)) + self.outside_s

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "source": self.source}
        if self.fit is not None:
            out["model"] = self.fit.wall.model
            out["sizes"] = [min(self.fit.sizes), max(self.fit.sizes)] if self.fit.sizes else None
            if self.outside is not None:
                out["optimizer_step"] = self.outside.as_dict()
                sep = " " if self.outside.seconds is not None else "; "
                out["source"] = f"{self.source}{sep}{self.outside.words()}"
        else:
            out["seconds"] = self.seconds
            out["steps"] = len(self.samples) if self.kind in ("measured", "tokens") else None
            out["at_global_tokens"] = self.at_global_tokens
            out["scaled"] = self.scaled
            if self.gen is not None:
                out["generation_fit"] = self.gen.as_dict()
                out["source"] = f"{self.source}; {self.gen.words()}"
        return out


def _microbatched(
    curve: Any, per_step: Any, big_n: float, n: float, packing: Sequence[float] | None = None
) -> np.ndarray:
    """A micro-batched phase's seconds per step: ``ceil(N / n)`` micro-batches (the last holds the rest), or
    the micro-batches a run really packed (``packing``: tokens of each, padding included)."""
    if packing:
        return sum(curve(float(t)) for t in packing) + per_step
    k = int(np.ceil(big_n / n - 1e-9))
    rest = big_n - (k - 1) * n
    return (k - 1) * curve(n) + curve(rest) + per_step


@dataclass
class PrecisionStep:
    precision: str
    terms: dict[str, PhaseTerm]
    boot: dict[str, Any] = field(
        default_factory=dict
    )  # phase -> (curve, per_step) replicates or (B,) medians
    placement: str = COLOCATED  # how the phases add up (perfmodel.step.overlap)

    def seconds(
        self,
        big_n: float,
        n: float,
        packing: Sequence[float] | None = None,
        generated: float | None = None,
    ) -> float:
        return float(combine(self.phase_seconds(big_n, n, packing, generated), self.placement))

    def learner_weight(
        self, big_n: float, n: float, packing: Sequence[float] | None = None, generated: float | None = None
    ) -> float:
        """How much of a change of the learner's phases reaches the step at (N, n): 1, 1/2 or 0."""
        return _learner_weight(self.phase_seconds(big_n, n, packing, generated), self.placement)

    def phase_seconds(
        self,
        big_n: float,
        n: float,
        packing: Sequence[float] | None = None,
        generated: float | None = None,
    ) -> dict[str, float]:
        return {p: t.point(big_n, n, _pack(p, packing), generated) for p, t in self.terms.items()}

    def phase_replicates(
        self,
        phase: str,
        big_n: float,
        n: float,
        b: int,
        packing: Sequence[float] | None = None,
        generated: float | None = None,
    ) -> np.ndarray:
        """(b,) replicates of one phase's seconds per step (a given phase: its value b times)."""
        t = self.terms[phase]
        if t.scaled:
            return t.gen.replicates(self.boot[phase][:b], big_n, generated)  # type: ignore[union-attr]
        if t.fit is not None:
            curve, per_step = self.boot[phase]
            reps = _microbatched(curve.take(slice(0, b)), per_step[:b], big_n, n, _pack(phase, packing))
            outside = self.boot.get(f"{phase}:outside")
            return np.asarray(reps, float) * np.ones(b) + (outside[:b] if outside is not None else 0.0)
        if t.kind == "measured":
            return np.asarray(self.boot[phase][:b], float)
        return np.full(b, float(t.seconds))  # type: ignore[arg-type]

    def replicates(
        self,
        big_n: float,
        n: float,
        b: int,
        packing: Sequence[float] | None = None,
        generated: float | None = None,
    ) -> np.ndarray:
        """(b,) replicates of the step: the placement's rule per replicate."""
        return self.combine_replicates(self.phases_replicates(big_n, n, b, packing, generated), b)

    def phases_replicates(
        self,
        big_n: float,
        n: float,
        b: int,
        packing: Sequence[float] | None = None,
        generated: float | None = None,
    ) -> dict[str, np.ndarray]:
        return {ph: self.phase_replicates(ph, big_n, n, b, packing, generated) for ph in self.terms}

    def combine_replicates(self, phases: dict[str, np.ndarray], b: int) -> np.ndarray:
        return np.zeros(b) + combine(phases, self.placement)

    def sizes(self) -> list[float]:
        return sorted({float(s) for t in self.terms.values() if t.fit is not None for s in t.fit.sizes})

    def replicate_count(self) -> tuple[int, str | None]:
        counts = []
        for phase, t in self.terms.items():
            if t.fit is None:
                continue
            curve = t.fit.wall.boot_curve()
            ps = t.fit.wall.per_step_boot()
            if curve is None or not len(ps):
                return 0, f"no bootstrap replicates of the {phase} fit of {self.precision} (--bootstrap 0?)"
            counts.append(min(len(np.atleast_1d(curve.a1)), len(ps)))
        return (min(counts) if counts else 0), None


def _pack(phase: str, packing: Sequence[float] | None) -> Sequence[float] | None:
    """A run's packing is that of its update micro-batches: the other fitted phases keep ``ceil(N / n)``."""
    return packing if phase == "update" else None


@dataclass(frozen=True)
class Setting:
    global_tokens: float
    tokens_per_microbatch: float
    source: str
    packing: tuple[float, ...] | None = None  # the runs' update micro-batches of a typical step (padded)
    generated_tokens: float | None = None  # --at N,n,G: tokens generated per step (else the runs' share)


def typical_packing(runs: Sequence[RunFolder]) -> tuple[float, ...] | None:
    """The update micro-batches of the runs' typical step: among the steps with the median micro-batch
    count, the one with the median padded tokens (lower median); None when no run recorded them."""
    packs = [
        tuple(float(t) for t in p)
        for r in sorted(runs, key=lambda r: r.path)
        if "microbatch_tokens" in r.steps.columns
        for p in r.steps["microbatch_tokens"]
        if p
    ]
    if not packs:
        return None
    ks = sorted(len(p) for p in packs)
    k = ks[(len(ks) - 1) // 2]
    same = sorted((p for p in packs if len(p) == k), key=lambda p: (sum(p), p))
    return same[(len(same) - 1) // 2]


def parse_phase_flags(items: Sequence[str]) -> tuple[dict[tuple[str, str], float], list[str]]:
    """``--phase`` values: ``PRECISION:PHASE=SECONDS`` sets a phase time; a bare name selects a phase to fit.
    Returns ({(precision, phase): seconds}, [phase names to fit]); a malformed value raises InputError."""
    from tracing.outputs.precisions import PRECISION_IDS

    times: dict[tuple[str, str], float] = {}
    names: list[str] = []
    for item in items:
        if ":" not in item and "=" not in item:
            if not item.strip():
                raise InputError(f"--phase {item!r}: empty; give a phase name or PRECISION:PHASE=SECONDS")
            names.append(item.strip())
            continue
        prec, sep1, rest = item.partition(":")
        phase, sep2, value = rest.partition("=")
        prec, phase = prec.strip(), phase.strip()
        try:
            secs = float(value)
        except ValueError:
            secs = float("nan")
        if not (sep1 and sep2 and prec and phase) or not np.isfinite(secs) or secs < 0:
            raise InputError(
                f"--phase {item!r}: expected PRECISION:PHASE=SECONDS (e.g. mxfp8:generate=1.2) or a phase name"
            )
        if prec not in PRECISION_IDS:
            raise InputError(f"--phase {item!r}: {prec!r} is not a precision id ({', '.join(PRECISION_IDS)})")
        if (prec, phase) in times and times[(prec, phase)] != secs:
            raise InputError(f"--phase {item!r}: {prec}:{phase} given twice with different seconds")
        times[(prec, phase)] = secs
    return times, names


_MAX_TOKENS = 2**53  # whole numbers exact as float64, far inside int64


def parse_at(items: Sequence[str]) -> list[tuple[int, ...]]:
    """``--at N,n[,G]`` values (several: repeat the flag or separate them by ';'); ``G``: tokens generated
    per step (of the ``N``), for a generation term fitted on prompt and generated tokens."""
    out: list[tuple[int, ...]] = []
    for item in items:
        for pair in str(item).split(";"):
            parts = [p.strip().replace("_", "") for p in pair.split(",")]
            try:
                floats = [float(p) for p in parts]
            except ValueError:
                floats = []
            # whole token counts only: inf raised OverflowError, 1000.7 became 1000 unsaid
            ok = (
                len(parts) in (2, 3)
                and len(floats) == len(parts)
                and all(math.isfinite(x) and x.is_integer() for x in floats)
            )
            vals = tuple(int(x) for x in floats) if ok else ()
            ok = ok and vals[0] > 0 and vals[1] > 0 and (len(vals) == 2 or vals[2] >= 0)
            # 1e30 came out as 4.1e20 tokens (int64 overflow) in the answer
            if ok and max(vals) >= _MAX_TOKENS:
                raise InputError(f"--at {pair!r}: 2**53 tokens or more; give a token count a step can have")
            if not ok:
                raise InputError(
                    f"--at {pair!r}: expected N,n (tokens per step, tokens per micro-batch), both positive whole "
                    "numbers, optionally ,G (tokens generated per step)"
                )
            big_n, n = vals[0], vals[1]
            if n > big_n:
                raise InputError(
                    f"--at {pair!r}: {n:,} tokens per micro-batch exceed the {big_n:,} tokens of the step"
                )
            if len(vals) == 3 and vals[2] > big_n:
                raise InputError(
                    f"--at {pair!r}: {vals[2]:,} generated tokens exceed the {big_n:,} tokens of the step"
                )
            out.append(vals)
    return out


def check_runs(runs: Sequence[RunFolder], models: Sequence[str]) -> None:
    """A run folder of a model that was not fitted is refused (its phases would join another model's step)."""
    for r in runs:
        if r.learner is None:
            raise InputError(
                f"{r.path}: the run folder records no learner precision (manifest config 'learner'): its phase "
                "times cannot be matched to a precision; give them with --phase PRECISION:PHASE=SECONDS"
            )
        if r.model is None:
            if len(set(models)) > 1:
                raise InputError(
                    f"{r.path}: the run folder does not record its model and the fit has several "
                    f"({', '.join(sorted(set(models)))}); its phase times cannot be matched"
                )
            continue
        if r.model not in models:
            raise InputError(
                f"{r.path}: a run of model {r.model!r}, but the micro-batch fits are of "
                f"{', '.join(sorted(set(models)))}: its phase times would join another model's step; pass runs "
                "of the fitted model"
            )


def _measured(
    model: str, runs: Sequence[RunFolder], models: Sequence[str]
) -> dict[tuple[str, str], tuple[list[float], list[str], list[float]]]:
    """(precision, phase) -> (pooled seconds per step, run paths, runs' tokens per step)."""
    out: dict[tuple[str, str], tuple[list[float], list[str], list[float]]] = {}
    for r in sorted(runs, key=lambda r: r.path):
        if (r.model or models[0]) != model:
            continue
        for phase, secs in r.phases.items():
            prec = r.precision_of(phase)
            if prec is None or phase in NOT_TERMS:
                continue
            s, paths, tokens = out.setdefault((prec, phase), ([], [], []))
            s.extend(secs)
            paths.append(r.path)
            if r.global_tokens:
                tokens.append(r.global_tokens)
    return out


def build_steps(
    model: str,
    fits: Mapping[tuple[str, str], PrecisionFit],
    precisions: Sequence[str],
    runs: Sequence[RunFolder],
    phase_times: Mapping[tuple[str, str], float],
    other_phases: Mapping[str, float],
    models: Sequence[str],
    seed: int = 0,
    n_boot: int = 1000,
) -> tuple[dict[str, PrecisionStep], list[str]]:
    """Per precision, its step terms (see the module docstring) and notes (flags that a fit overrides)."""
    measured = _measured(model, runs, models)
    outside = optimizer_terms(runs, model, models[0], precisions)
    notes: list[str] = [
        f"{o.precision}: no optimizer step in the update prediction: {o.reason}"
        for o in outside.values()
        if o.samples and o.reason  # measured, but withdrawn (one-sided)
    ]
    gens = (
        generation_fits(runs, model, models[0], precisions, seed, n_boot)
        if any(p == GEN_PHASE for (_, p) in measured)
        else {}
    )
    steps: dict[str, PrecisionStep] = {}
    for prec in precisions:
        terms: dict[str, PhaseTerm] = {}
        fitted = {ph: f for (ph, p), f in fits.items() if p == prec}
        for ph, f in fitted.items():
            terms[ph] = PhaseTerm(
                ph,
                "fitted",
                f"micro-batch fit of {model}/{ph}/{prec}",
                fit=f,
                outside=outside[prec] if ph == OUTSIDE_PHASE else None,
            )
            if (prec, ph) in phase_times:
                notes.append(
                    f"--phase {prec}:{ph} not used: {ph} is fitted from micro-batches (predicted at your N, n)"
                )
        phases = {ph for (p, ph) in measured if p == prec} | set(other_phases)
        phases |= {ph for (p, ph) in phase_times if p == prec}
        notes += [
            f"{ph} given but not used: the trainer's wait for a separate sampler is no term of the step (the "
            "max of generate and the learner holds it); give generate"
            for ph in sorted(phases & NOT_TERMS)
        ]
        phases -= NOT_TERMS
        for ph in sorted(phases - set(fitted)):
            if (prec, ph) in phase_times:
                terms[ph] = PhaseTerm(ph, "given", f"--phase {prec}:{ph}", seconds=phase_times[(prec, ph)])
            elif ph in other_phases:
                terms[ph] = PhaseTerm(
                    ph,
                    "given",
                    f"--other-phase {ph} (the same for every precision)",
                    seconds=other_phases[ph],
                )
            else:
                secs, paths, tokens = measured[(prec, ph)]
                gen = gens.get(prec) if ph == GEN_PHASE else None
                terms[ph] = PhaseTerm(
                    ph,
                    "tokens" if gen is not None and gen.used else "measured",
                    f"median over {len(secs)} steps of {', '.join(paths)}",
                    samples=tuple(sorted(secs)),
                    seconds=float(np.median(secs)),
                    at_global_tokens=float(np.median(tokens)) if tokens else None,
                    runs=tuple(paths),
                    gen=gen,
                )
        order = {p: i for i, p in enumerate(PHASE_ORDER)}
        terms = dict(sorted(terms.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
        steps[prec] = PrecisionStep(prec, terms)
        one = [p for p, t in terms.items() if t.kind == "measured" and len(t.samples) == 1]
        if one:  # its replicates are all that one value: an interval of zero width, unsaid
            notes.append(
                f"{model} {prec}: {', '.join(one)} measured in one step only: the step-to-step spread is "
                "unknown and not in the intervals (give runs of several steps)"
            )
    _draw(steps, seed, n_boot)
    return steps, list(dict.fromkeys(notes))


def _draw(steps: Mapping[str, PrecisionStep], seed: int, n_boot: int) -> None:
    """Replicates per term, drawn once (so every (N, n) and every scan point uses the same draws)."""
    for prec, st in steps.items():  # a stream per precision name: the same draws whatever the input order
        rng = np.random.default_rng([seed, 33, zlib.crc32(prec.encode())])
        b, _ = st.replicate_count()
        fitted = any(t.fit is not None for t in st.terms.values())
        b = b if fitted else n_boot
        for phase, t in list(st.terms.items()):
            if t.scaled and b:  # the generation fit's own bootstrap replicates of its three coefficients
                st.boot[phase] = np.resize(t.gen.boot, (b, 3))  # type: ignore[union-attr]
            elif t.fit is not None:
                if b:
                    st.boot[phase] = (t.fit.wall.boot_curve(), np.asarray(t.fit.wall.per_step_boot(), float))
                if t.outside is not None and t.outside.seconds is not None:  # its own stream: same draws
                    o_rng = np.random.default_rng(
                        [seed, 33, zlib.crc32(prec.encode()), zlib.crc32(b"outside")]
                    )
                    reps = t.outside.draw(o_rng, max(b, n_boot, 1))
                    ci = _ci(reps)
                    st.terms[phase] = replace(t, outside=replace(t.outside, ci=tuple(ci) if ci else None))
                    if b:
                        st.boot[f"{phase}:outside"] = reps[:b]
            elif t.kind == "measured" and b:
                st.boot[phase] = median_replicates(np.asarray(t.samples, float), rng, b)


def compare_at(
    base: PrecisionStep,
    low: PrecisionStep,
    big_n: float,
    n: float,
    source: str = "",
    packing: Sequence[float] | None = None,
    generated: float | None = None,
) -> dict[str, Any]:
    """Step seconds of both precisions at (N, n), the gain ``1 - low / base`` and where it comes from,
    with 95 % percentile intervals over the replicates (null with ``reason`` without replicates).
    ``packing``: the update micro-batches the runs really packed (else ``ceil(N / n)``); ``generated``:
    tokens generated per step (a fitted generation term; else the runs' generated share of ``N``)."""
    g = generated
    sb, sl = base.seconds(big_n, n, packing, g), low.seconds(big_n, n, packing, g)
    pb, pl = base.phase_seconds(big_n, n, packing, g), low.phase_seconds(big_n, n, packing, g)
    gens = {st.precision: st.terms[GEN_PHASE].gen for st in (base, low) if GEN_PHASE in st.terms}
    b = min(base.replicate_count()[0], low.replicate_count()[0])
    why = base.replicate_count()[1] or low.replicate_count()[1]
    if not b and not why:
        why = "no replicates to draw an interval from"
    sizes = sorted(set(base.sizes()) | set(low.sizes()))
    out: dict[str, Any] = {
        "global_tokens": int(big_n),
        "tokens_per_microbatch": int(n),
        "microbatches": len(packing) if packing else int(np.ceil(big_n / n - 1e-9)),
        "packing": (
            {
                "microbatch_tokens": [int(t) for t in packing],
                "padded_tokens": int(sum(packing)),
                "ceil_microbatches": int(np.ceil(big_n / n - 1e-9)),
                "source": "the runs' update micro-batches of a typical step (ranges.parquet, padding included)",
            }
            if packing
            else None
        ),
        "source": source,
        "generated_tokens": generated,
        "generation_tokens": {
            p: dict(zip(("prompt", "generated"), f.tokens(big_n, g), strict=True))
            for p, f in gens.items()
            if f is not None and f.used
        }
        or None,
        "extrapolated": bool(sizes and not (sizes[0] <= n <= sizes[-1])),
        "measured_at_other_global_batch": sorted(
            {
                ph
                for st in (base, low)
                for ph, t in st.terms.items()
                if t.kind == "measured"
                and t.at_global_tokens
                and abs(t.at_global_tokens - big_n) > 0.02 * big_n
            }
        ),
        "per_precision": {
            base.precision: {"step_s": sb, "phases_s": pb},
            low.precision: {"step_s": sl, "phases_s": pl},
        },
        "diff_s": sl - sb,
        "gain": 1.0 - sl / sb if sb > 0 else None,
        "gain_by_phase": _gain_by_phase(pb, pl, sb, base.placement) if sb > 0 else None,
        "overlap": overlap_entry(pb, pl, None, (base.precision, low.precision), base.placement),
        "diff_ci": None,
        "gain_ci": None,
        "significant": None,
        "reason": why,
    }
    if b and sb > 0:
        per = {st.precision: st.phases_replicates(big_n, n, b, packing, g) for st in (base, low)}
        rb, rl = (st.combine_replicates(per[st.precision], b) for st in (base, low))
        out["overlap"] = overlap_entry(pb, pl, per, (base.precision, low.precision), base.placement)
        out["per_precision"][base.precision]["step_ci"] = _ci(rb)
        out["per_precision"][low.precision]["step_ci"] = _ci(rl)
        ok = rb > 0
        out["diff_ci"] = _ci(rl - rb)
        out["gain_ci"] = _ci(1.0 - rl[ok] / rb[ok])
        g = out["gain_ci"]
        out["significant"] = bool(g is not None and (g[0] > 0 or g[1] < 0))
    return out


def _root(ns: np.ndarray, d: np.ndarray) -> tuple[float | None, str]:
    """The first sign change of ``d`` over ``ns`` (log-interpolated) and the direction: ``faster_above``
    (d goes from > 0 to <= 0), ``faster_below``, or ``faster`` / ``slower`` (no change)."""
    s = np.sign(d)
    for i in range(len(ns) - 1):
        if s[i] != s[i + 1] and s[i] != 0:
            x0, x1, d0, d1 = np.log(ns[i]), np.log(ns[i + 1]), d[i], d[i + 1]
            x = x0 + (x1 - x0) * d0 / (d0 - d1) if d0 != d1 else x0
            return float(np.exp(x)), ("faster_above" if d0 > 0 else "faster_below")
    return None, ("faster" if np.all(d <= 0) else "slower")


def step_breakeven(
    base: PrecisionStep, low: PrecisionStep, big_n: float, n_max: float | None = None
) -> dict[str, Any]:
    """The micro-batch size at which the whole steps take equally long for ``N`` tokens per step, scanned
    from the smallest measured size to ``min(N, n_max)``; its interval: the same scan on every replicate
    (a replicate that does not cross there counts as below or above the range, an unbounded end)."""
    sizes = sorted(set(base.sizes()) | set(low.sizes()))
    lo_n = max(1.0, sizes[0] if sizes else 1.0)
    hi_n = min(big_n, n_max) if n_max else big_n
    out: dict[str, Any] = {
        "global_tokens": int(big_n),
        "range": [lo_n, hi_n],
        "case": None,
        "tokens": None,
        "ci": None,
        "extrapolated": None,
        "significant_everywhere": None,
        "reason": None,
    }
    if hi_n <= lo_n:
        out["reason"] = f"no micro-batch size between {lo_n:,.0f} and {hi_n:,.0f} tokens to scan"
        return out
    ns = np.unique(np.concatenate([np.geomspace(lo_n, hi_n, SCAN_POINTS), [s for s in sizes if s <= hi_n]]))
    d = np.array([low.seconds(big_n, n) - base.seconds(big_n, n) for n in ns])
    if base.placement == SEPARATE and not np.any(d):
        out["reason"] = (
            "the steps take equally long at every size: generation is the longer side in both precisions and "
            "the same in both, so the micro-batch size does not move the step"
        )
        return out
    root, case = _root(ns, d)
    out["case"], out["tokens"] = case, root
    out["extrapolated"] = bool(root is not None and sizes and not (sizes[0] <= root <= sizes[-1]))
    b = min(base.replicate_count()[0], low.replicate_count()[0])
    if not b:
        out["reason"] = base.replicate_count()[1] or low.replicate_count()[1] or "no replicates"
        return out
    reps = np.stack([low.replicates(big_n, n, b) - base.replicates(big_n, n, b) for n in ns], axis=1)
    if root is None:  # faster or slower over the whole range: significant where the interval excludes 0
        lo, hi = np.quantile(reps, [0.025, 0.975], axis=0)
        out["significant_everywhere"] = bool(np.all(hi < 0) if case == "faster" else np.all(lo > 0))
        return out
    roots = []
    for r in reps:
        x, c = _root(ns, r)
        if x is not None:
            roots.append(x)
        else:  # no crossing in range: low faster throughout puts the root below (faster_above) or above
            below = (c == "faster") == (case == "faster_above")
            roots.append(-np.inf if below else np.inf)
    lo, hi = percentile_ci(np.asarray(roots), LEVEL)
    out["ci"] = [float(lo) if np.isfinite(lo) else None, float(hi) if np.isfinite(hi) else None]
    return out


def memory_cap_tokens(step: PrecisionStep, cap_bytes: float | None) -> tuple[float | None, str | None]:
    """Largest micro-batch under the cap over the precision's fitted phases (their ``peak_mem_bytes``
    lines), or why there is none."""
    if cap_bytes is None:
        return None, None
    caps = []
    for ph, t in step.terms.items():
        if t.fit is None:
            continue
        if t.fit.memory is None:
            return (
                None,
                f"no peak_mem_bytes measured for {ph} of {step.precision}: --mem-cap-bytes not applied",
            )
        c = max_tokens_under_cap(t.fit.memory.line(), cap_bytes)
        if c is not None:
            caps.append(c)
    return (float(min(caps)) if caps else None), None


def recommend_step(
    base: PrecisionStep,
    low: PrecisionStep,
    big_n: float | None,
    cap_bytes: float | None,
    why_no_n: str | None = None,
) -> dict[str, Any]:
    """Per precision the fastest measured micro-batch size allowed by ``N`` and the memory cap (and the
    fastest beyond the measured sizes, marked extrapolated); the precision named only when the gain at its
    size has an interval that excludes zero. No ``N``: no recommendation, and ``reason`` says why."""
    out: dict[str, Any] = {
        "global_tokens": int(big_n) if big_n else None,
        "mem_cap_bytes": cap_bytes,
        "precision": None,
        "tokens_per_microbatch": None,
        "step_s": None,
        "per_precision": {},
        "reason": None,
    }
    if not big_n:
        out["reason"] = why_no_n or "no global batch known"
        return out
    for st in (base, low):
        n_cap, cap_note = memory_cap_tokens(st, cap_bytes)
        limit = min(big_n, n_cap) if n_cap is not None else big_n
        sizes = st.sizes()
        cands = [s for s in sizes if 1 <= s <= limit]
        entry: dict[str, Any] = {"memory_limit_tokens": n_cap, "memory_note": cap_note}
        if not cands:
            entry["reason"] = (
                f"no measured size fits (limit {limit:,.0f} tokens per micro-batch: "
                + ("memory cap" if n_cap is not None and n_cap < big_n else "the global batch")
                + ")"
            )
        else:
            best = min(cands, key=lambda s: st.seconds(big_n, s))
            entry.update(tokens_per_microbatch=int(best), step_s=st.seconds(big_n, best))
            if limit > sizes[-1]:  # beyond the measured sizes: said, marked extrapolated, never chosen
                grid = np.unique(np.concatenate([np.geomspace(sizes[-1], limit, 24), [np.floor(limit)]]))
                ext = min(grid, key=lambda s: st.seconds(big_n, s))
                if st.seconds(big_n, ext) < entry["step_s"] * 0.99:
                    entry["extrapolated_best"] = {
                        "tokens_per_microbatch": int(ext),
                        "step_s": st.seconds(big_n, ext),
                        "extrapolated": True,
                    }
        out["per_precision"][st.precision] = entry
    ok = {p: e for p, e in out["per_precision"].items() if e.get("step_s") is not None}
    if not ok:
        out["reason"] = "no precision has a measured micro-batch size that fits"
        return out
    best = min(ok, key=lambda p: ok[p]["step_s"])
    n_best = ok[best]["tokens_per_microbatch"]
    cmp = compare_at(base, low, big_n, n_best, "recommended size")
    out["comparison"] = cmp
    out["tokens_per_microbatch"] = n_best
    out["step_s"] = ok[best]["step_s"]
    if cmp["significant"]:
        out["precision"] = best
    else:
        why = (
            "the gain's 95 % interval holds zero"
            if cmp["gain_ci"] is not None
            else f"no interval ({cmp['reason']})"
        )
        out["reason"] = f"at {n_best:,} tokens per micro-batch the precisions are not told apart: {why}"
    return out


CORE_PHASES = ("generate", "logprob", "update", "sync")


def _logged_global_tokens(runs: Sequence[RunFolder], model: str) -> tuple[float, str] | None:
    """The median tokens per step of the sources that log it without a micro-batch size (metric logs'
    token counts) and where that came from; None without any."""
    rs = [r for r in runs if (r.model or model) == model and r.global_tokens and not r.tokens_per_microbatch]
    if not rs:
        return None
    big_n = float(np.median([r.global_tokens for r in rs]))
    return round(big_n), f"the tokens per step the logs of {', '.join(sorted(r.path for r in rs))} count"


def _data_global_tokens(mb: Any, model: str) -> float | None:
    """Tokens per step the data record (``global_tokens``, or traced steps), never guessed from the sizes."""
    if mb is None or mb.empty:
        return None
    g = default_global_tokens(mb[mb["model"] == model])
    return float(g) if g else None


def step_models(
    fits: Mapping[tuple[str, str, str], PrecisionFit],
    baseline: str,
    runs: Sequence[RunFolder] = (),
    *,
    at: Sequence[tuple[int, ...]] = (),
    global_tokens: int | None = None,
    mem_cap_bytes: float | None = None,
    phase_times: Mapping[tuple[str, str], float] | None = None,
    other_phases: Mapping[str, float] | None = None,
    microbatches: Any = None,
    seed: int = 0,
    n_boot: int = 1000,
    placement: str | None = None,
    separate_sampler: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One whole-step comparison per (model, low precision): the terms of each precision's step, the gain at
    the user's settings (``at``, else the run folders' settings), the whole-step breakeven and the
    recommendation at the global batch (``global_tokens``, else the first setting's, else the data's
    ``global_tokens``; none: no recommendation and why). ``placement``: ``--placement`` (None: from the
    inputs, ``separate_sampler``: source path -> why it ran with a separate sampler, else colocated)."""
    phase_times = dict(phase_times or {})
    other_phases = dict(other_phases or {})
    models = sorted({m for m, _, _ in fits})
    check_runs(runs, models)
    out = []
    for model in models:
        mfits = {(ph, p): f for (m, ph, p), f in fits.items() if m == model}
        precs = sorted({p for _, p in mfits})
        if baseline not in precs:
            continue
        for low in [p for p in precs if p != baseline]:
            pair = {k: f for k, f in mfits.items() if k[1] in (baseline, low)}
            steps, notes = build_steps(
                model, pair, [baseline, low], runs, phase_times, other_phases, models, seed, n_boot
            )
            chosen, said = comparison_placement(
                runs, model, models, (baseline, low), placement, separate_sampler or {}
            )
            for st in steps.values():
                st.placement = chosen.name
            notes = [*notes, *said]
            out.append(
                _comparison(
                    model,
                    steps[baseline],
                    steps[low],
                    runs,
                    at,
                    global_tokens,
                    mem_cap_bytes,
                    microbatches,
                    notes,
                    chosen,
                    _waits_only(runs, model, models, steps),
                )
            )
    return out


def comparison_placement(
    runs: Sequence[RunFolder],
    model: str,
    models: Sequence[str],
    precisions: Sequence[str],
    flag: str | None,
    separate_sampler: Mapping[str, str],
) -> tuple[Placement, list[str]]:
    """The placement of one comparison (``--placement``, else the inputs of these precisions, else the
    default) and notes where the flag overrides an input, or where the inputs disagree (an async trainer's
    log beside one that does not say so: its phases were measured with another placement)."""
    evidence = _evidence(runs, model, models, precisions, separate_sampler)
    placement, notes = choose(flag, evidence)
    silent = sorted(
        {
            r.path
            for r in runs
            if r.path not in evidence and (r.model or models[0]) == model and r.learner in precisions
        }
    )
    if flag is None and evidence and silent:
        notes.append(
            f"separate sampler from {', '.join(sorted(evidence))}, but {', '.join(silent)} do not say they ran "
            "with one: their phases are combined as if they had (a step measured colocated may be predicted "
            "too short); give --placement, or compare runs of one trainer"
        )
    return placement, notes


def _evidence(
    runs: Sequence[RunFolder],
    model: str,
    models: Sequence[str],
    precisions: Sequence[str],
    separate_sampler: Mapping[str, str],
) -> dict[str, str]:
    """Source -> why it ran with a separate sampler, for the sources of this comparison."""
    return {
        r.path: separate_sampler[r.path]
        for r in runs
        if r.path in separate_sampler and (r.model or models[0]) == model and r.learner in precisions
    }


def _waits_only(
    runs: Sequence[RunFolder], model: str, models: Sequence[str], steps: Mapping[str, PrecisionStep]
) -> dict[str, list[str]]:
    """Precision -> its sources that log the trainer's wait for a separate sampler but no generation time,
    for a precision whose step has no generate term."""
    out: dict[str, list[str]] = {}
    for r in sorted(runs, key=lambda r: r.path):
        prec = r.precision_of(GEN_PHASE)
        if (r.model or models[0]) != model or prec not in steps or GEN_PHASE in steps[prec].terms:
            continue
        if NOT_TERMS & set(r.phases) and GEN_PHASE not in r.phases:
            out.setdefault(str(prec), []).append(r.path)
    return out


def _no_generation(waits: Mapping[str, list[str]], placement: str) -> str:
    """Why a step whose sampler's sources log only the trainer's wait has no generate term, and the fix."""
    where = "; ".join(f"{p}: {', '.join(paths)}" for p, paths in sorted(waits.items()))
    fix = ", ".join(f"--phase {p}:generate=SECONDS" for p in sorted(waits))
    said = (
        f"{where} log(s) the trainer's wait for the sampler, not the generation time; give the generation "
        f"time ({fix}, e.g. from a colocated run or the sampler's own timers)"
    )
    if placement == SEPARATE:
        return f"with a separate sampler the step is max(generate, learner) + sync, but {said}"
    return f"generate is not in the step: {said}"


def _comparison(
    model: str,
    base: PrecisionStep,
    low: PrecisionStep,
    runs: Sequence[RunFolder],
    at: Sequence[tuple[int, ...]],
    global_tokens: int | None,
    mem_cap_bytes: float | None,
    mb: Any,
    notes: list[str],
    placement: Placement | None = None,
    waits: Mapping[str, list[str]] | None = None,
) -> dict[str, Any]:
    placement = placement or Placement()
    entry: dict[str, Any] = {
        "model": model,
        "baseline": base.precision,
        "precision": low.precision,
        "placement": placement.as_dict(),
        "phases": {st.precision: {ph: t.as_dict() for ph, t in st.terms.items()} for st in (base, low)},
        "not_in_step": [p for p in CORE_PHASES if p not in base.terms and p not in low.terms],
        "notes": notes,
        "settings": [],
        "validation": None,
        "breakeven": None,
        "recommendation": None,
        "reason": None,
        "_steps": (base, low),  # for the what-ifs (perfmodel.step.whatifs), popped before fits.json
    }
    one_sided = sorted(set(base.terms) ^ set(low.terms))
    if one_sided:
        said = "; ".join(
            f"{ph} known for {st.precision} only ({st.terms[ph].source})"
            for ph in one_sided
            for st in (base, low)
            if ph in st.terms
        )
        other = {ph: (low if ph in base.terms else base).precision for ph in one_sided}
        fix = ", ".join(f"--phase {p}:{ph}=SECONDS" for ph, p in other.items())
        entry["reason"] = f"the two steps hold different phases: {said}; give the other precision's ({fix})"
        return entry
    if waits and placement.name == SEPARATE:
        entry["reason"] = _no_generation(waits, placement.name)
        return entry
    if waits:
        entry["notes"] = [*notes, _no_generation(waits, placement.name)]
    if placement.name == SEPARATE and GEN_PHASE not in base.terms:
        entry["notes"] = [*notes, "separate sampler, but the step has no generate phase: nothing overlaps"]
    withheld = [
        f"{ph} of {st.precision}: {t.fit.wall.note or 'no model fits'}"
        for st in (base, low)
        for ph, t in st.terms.items()
        if t.fit is not None and t.fit.wall.model is None
    ]
    if withheld:
        entry["reason"] = "no step prediction: no model fits " + "; ".join(withheld)
        return entry
    settings = [
        Setting(float(a[0]), float(a[1]), "--at", generated_tokens=float(a[2]) if len(a) > 2 else None)
        for a in at
    ]
    if not settings:  # the runs' own settings: median tokens per step, tokens per micro-batch
        seen: dict[tuple[int, int], list[RunFolder]] = {}
        for r in sorted(runs, key=lambda r: r.path):
            if (r.model or model) == model and r.global_tokens and r.tokens_per_microbatch:
                key = (round(r.global_tokens), round(r.tokens_per_microbatch))
                if key[1] <= key[0]:
                    seen.setdefault(key, []).append(r)
        for (big_n, n), rs in seen.items():
            src = f"the settings of {', '.join(r.path for r in rs)}"
            settings.append(Setting(float(big_n), float(n), src, typical_packing(rs)))
    entry["settings"] = [
        compare_at(
            base, low, s.global_tokens, s.tokens_per_microbatch, s.source, s.packing, s.generated_tokens
        )
        for s in settings
    ]
    entry["validation"] = validate_runs({base.precision: base, low.precision: low}, runs, model)
    big_n, why = None, None
    if global_tokens:
        big_n, entry["global_tokens_source"] = float(global_tokens), "--global-batch"
    elif settings:
        big_n, entry["global_tokens_source"] = settings[0].global_tokens, settings[0].source
    elif (g := _logged_global_tokens(runs, model)) is not None:
        big_n, entry["global_tokens_source"] = g
    elif (g := _data_global_tokens(mb, model)) is not None:
        big_n, entry["global_tokens_source"] = g, "the micro-batch table (global_tokens or traced steps)"
    else:
        why = NO_GLOBAL_BATCH.replace("hold no traced steps", "hold no traced steps, no run folder gives one")
        entry["global_tokens_source"] = None
    entry["global_tokens"] = int(big_n) if big_n else None
    caps = [c for c in (memory_cap_tokens(st, mem_cap_bytes)[0] for st in (base, low)) if c is not None]
    if big_n:
        entry["breakeven"] = step_breakeven(base, low, big_n, max(caps) if caps else None)
    entry["recommendation"] = recommend_step(base, low, big_n, mem_cap_bytes, why)
    for s in entry["settings"]:
        n = s["tokens_per_microbatch"]
        over = [
            st.precision
            for st in (base, low)
            if (c := memory_cap_tokens(st, mem_cap_bytes)[0]) is not None and n > c
        ]
        s["over_memory_cap"] = over
    return entry


def other_phase_seconds(
    model: str,
    precisions: Sequence[str],
    runs: Sequence[RunFolder],
    other_phases: Mapping[str, float],
    phase_times: Mapping[tuple[str, str], float],
    exclude: str,
) -> dict[str, dict[str, float]]:
    """Per precision, seconds per step of the phases besides ``exclude`` (its own: ``--phase P:X``, else
    ``--other-phase X``, else the median of its run folders' steps); only phases every precision has."""
    models = sorted({r.model for r in runs if r.model} | {model})
    measured = _measured(model, runs, models)
    out: dict[str, dict[str, float]] = {}
    for prec in precisions:
        names = {ph for (p, ph) in measured if p == prec} | set(other_phases)
        names |= {ph for (p, ph) in phase_times if p == prec}
        out[prec] = {}
        for ph in sorted(names - {exclude}):
            if (prec, ph) in phase_times:
                out[prec][ph] = float(phase_times[(prec, ph)])
            elif ph in other_phases:
                out[prec][ph] = float(other_phases[ph])
            else:
                out[prec][ph] = float(np.median(measured[(prec, ph)][0]))
    common = set.intersection(*(set(v) for v in out.values())) if out else set()
    return {p: {ph: s for ph, s in v.items() if ph in common} for p, v in out.items()}
