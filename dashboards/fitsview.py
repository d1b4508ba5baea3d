"""What the Breakeven page says about a ``fits.json`` entry: pure functions, no Streamlit, no files.

Reads the v1 fields and the v2 ones (``breakeven.extrapolated / model_ok / crossing / basis``, a second
``breakeven_gpu_busy``, case ``undetermined``, ``fits.<precision>.per_step_s / per_step_ci``). A field an
older (or newer) fits.json lacks reads "not in this output", never an error and never a made-up value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ABSENT = "not in this output"
BASES = (("breakeven", "wall clock"), ("breakeven_gpu_busy", "GPU busy (host overhead removed)"))


def tokens(x: float | None) -> str:
    return "?" if x is None or not np.isfinite(x) else f"{x:,.0f}"


def units(text: str) -> str:
    """One spelling of microseconds on the page: perfmodel's plain-ASCII 'us' becomes 'µs'."""
    return re.sub(r"(?<=\d )us\b|\bus/token\b", lambda m: "µs" if m.group(0) == "us" else "µs/token", text)


def _interval(ci: Sequence[float | None] | None) -> str:
    lo, hi = ([*(ci or []), None, None])[:2]
    if lo is None and hi is None:
        return "no interval"
    return f"95 % CI {tokens(lo)} to {tokens(hi)}"


def crossing_words(be: Mapping[str, Any]) -> str | None:
    """'the measured times cross between 512 and 1,024 tokens' from ``crossing`` (v2), else None."""
    if "crossing" not in be:
        return None
    crossing = be.get("crossing")
    if not crossing:
        return "the measured times do not change order within the measured sizes"
    lo, hi = crossing[0], crossing[1]
    return f"the measured times cross between {tokens(lo)} and {tokens(hi)} tokens"


def breakeven_sentence(entry: Mapping[str, Any], key: str = "breakeven") -> str:
    """The breakeven of one ``fits.json`` model entry, in words (case table of docs/contracts.md, v2 honesty rules)."""
    low = entry.get("precision", "low precision")
    base = entry.get("baseline", "bf16")
    be = entry.get(key) or {}
    case = be.get("case")
    n = be.get("tokens")
    where = f"{entry.get('model', '?')} / {entry.get('phase', '?')}"
    if key != "breakeven":
        where += ", GPU busy time (host overhead removed)"
    crossing = crossing_words(be)
    if be.get("model_ok") is False:
        why = (
            f"the fitted lines do not describe the data (model rejected){'; ' + crossing if crossing else ''}"
        )
        if n is None:
            return f"{where}: no n* reported: {why}."
        source = f"the {be['model']} model, which fits" if be.get("model") else "a model that fits"
        side = "above" if case == "faster_above" else "below"
        return (
            f"{where}: {low} is faster than {base} {side} n* = {tokens(n)} tokens per micro-batch "
            f"({_interval(be.get('ci'))}, from {source}); the straight lines are rejected"
            f"{'; ' + crossing if crossing else ''}."
        )
    if case in ("faster_above", "faster_below"):
        side = "above" if case == "faster_above" else "below"
        interval = _interval(be.get("ci"))
        if be.get("ci_reason"):
            interval += f"; {be['ci_reason']}"
        extra = " (extrapolated: outside the measured sizes)" if be.get("extrapolated") else ""
        why = (
            f"{low} adds fixed cost per micro-batch but saves per token"
            if side == "above"
            else f"{low} saves fixed cost but costs more per token"
        )
        tail = f" Model-free check: {crossing}." if crossing else ""
        return (
            f"{where}: {low} is faster than {base} {side} n* = {tokens(n)} tokens per micro-batch "
            f"({interval}){extra}. Why: {why}.{tail}"
        )
    sentences = {
        "always_faster": f"{low} is faster than {base} at every micro-batch size (it saves per token and "
        "adds no significant fixed cost, or saves fixed cost at no significant per-token loss).",
        "never_faster": f"{low} is never faster than {base} here: it costs more per token, or adds fixed cost "
        "without a significant per-token saving.",
        "indistinguishable": f"{low} and {base} are indistinguishable at the 95 % level: neither the fixed "
        "nor the per-token difference is significant. More repeats or sizes would narrow it.",
        "undetermined": f"{low} vs {base} is undetermined: the intervals cannot be computed (one measurement "
        "per size, no resampling). Measure repeats at each size.",
    }
    text = sentences.get(case, f"unknown breakeven case {case!r} in fits.json")
    return f"{where}: {text}" + (f" Model-free check: {crossing}." if crossing else "")


def _flag(value: Any) -> str:
    if value is None:
        return ABSENT
    return "yes" if value else "no"


def breakeven_facts(entry: Mapping[str, Any]) -> pd.DataFrame:
    """One row per basis (wall clock; GPU busy): case, n*, interval, extrapolated, model ok, crossing."""
    rows = []
    for key, label in BASES:
        be = entry.get(key)
        if not isinstance(be, Mapping):
            reason = ABSENT if key not in entry else "null (no GPU data in the inputs)"
            rows.append({"basis": label, "case": reason})
            continue
        crossing = be.get("crossing") if "crossing" in be else ABSENT
        rows.append(
            {
                "basis": label,
                "case": be.get("case"),
                "n* tokens": tokens(be.get("tokens")) if be.get("tokens") is not None else "none",
                "95 % CI": _interval(be.get("ci")),
                "extrapolated": _flag(be.get("extrapolated")),
                "model ok": _flag(be.get("model_ok")),
                "measured crossing": crossing
                if isinstance(crossing, str)
                else ("none" if not crossing else f"{tokens(crossing[0])} – {tokens(crossing[1])}"),
            }
        )
    cols = ["basis", "case", "n* tokens", "95 % CI", "extrapolated", "model ok", "measured crossing"]
    return pd.DataFrame(rows).reindex(columns=cols).fillna("")


def _ms_ci(value: Any, ci: Any, scale: float) -> str:
    if value is None:
        return ABSENT
    lo, hi = ([*(ci or []), None, None])[:2]
    ci_txt = f" [{lo * scale:.3g}, {hi * scale:.3g}]" if lo is not None and hi is not None else ""
    return f"{float(value) * scale:.4g}{ci_txt}"


def fit_table(entry: Mapping[str, Any], fits: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Per precision: fixed ms, per-token µs and per-step ms with their 95 % CIs, the model the data chose
    (line / knee / parts) and its knee, R², points, flags. ``fits`` overrides the entry's (another basis)."""
    rows = []
    for prec, f in (fits if fits is not None else entry.get("fits") or {}).items():
        lof = f.get("lack_of_fit") or {}
        rows.append(
            {
                "precision": prec,
                "fixed ms [95 % CI]": _ms_ci(f.get("fixed_s"), f.get("fixed_ci"), 1e3),
                "per-token µs [95 % CI]": _ms_ci(f.get("per_token_s"), f.get("per_token_ci"), 1e6),
                "per-step ms [95 % CI]": _ms_ci(f.get("per_step_s"), f.get("per_step_ci"), 1e3)
                if "per_step_s" in f
                else ABSENT,
                "model": f.get("model") or ABSENT,
                "knee tokens": tokens((chosen_knee(f) or {}).get("knee_tokens"))
                if chosen_knee(f)
                else "none",
                "R²": f.get("r2"),
                "points": f.get("n_points"),
                "lack of fit": ("flagged: " if lof.get("flag") else "") + str(lof.get("note") or "")
                if lof
                else ABSENT,
                "implausible": "; ".join(implausible_reasons(f)) or "no",
            }
        )
    return pd.DataFrame(rows)


def fit_numbers(entry: Mapping[str, Any], fits: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The numbers behind :func:`fit_table` for a download, in seconds: one row per precision and
    coefficient (``fixed_s``, ``per_token_s``, ``per_step_s``) with ``value``, ``lower``, ``upper`` (the
    95 % interval, NaN when fits.json has none) and ``implausible``."""
    rows = []
    for prec, f in (fits if fits is not None else entry.get("fits") or {}).items():
        bad = implausible_reasons(f)
        for name, ci in (
            ("fixed_s", "fixed_ci"),
            ("per_token_s", "per_token_ci"),
            ("per_step_s", "per_step_ci"),
        ):
            if f.get(name) is None:
                continue
            lo, hi = ([*(f.get(ci) or []), None, None])[:2]
            rows.append(
                {
                    "precision": prec,
                    "coefficient": name,
                    "value": float(f[name]),
                    "lower": np.nan if lo is None else float(lo),
                    "upper": np.nan if hi is None else float(hi),
                    "model": f.get("model"),
                    "implausible": "; ".join(bad),
                }
            )
    return pd.DataFrame(
        rows, columns=["precision", "coefficient", "value", "lower", "upper", "model", "implausible"]
    )


def per_step_implausible(fit: Mapping[str, Any]) -> str | None:
    """Why a precision's per-step cost is no cost a machine can have (its whole 95 % interval below zero),
    None when it is plausible or absent. An older fits.json does not list it under ``implausible``."""
    ps = fit.get("per_step_s")
    lo, hi = ([*(fit.get("per_step_ci") or []), None, None])[:2]
    if ps is None or hi is None or not hi < 0:
        return None
    lo_txt = f"{lo * 1e3:.3g}" if lo is not None else "?"
    return (
        f"per-step cost {ps * 1e3:.3g} ms is below zero (95 % CI {lo_txt} to {hi * 1e3:.3g} ms, all of it below "
        "zero): the first micro-batch of a step ran faster than the others -- their windows overlap or are out "
        "of order -- so it is no cost per step"
    )


def implausible_reasons(fit: Mapping[str, Any]) -> list[str]:
    """fits.json's ``implausible`` list, plus the per-step rule when the list does not hold it already."""
    out = [str(m) for m in fit.get("implausible") or []]
    per_step = per_step_implausible(fit)
    if per_step and not any(m.startswith("per-step cost") for m in out):
        out.append(per_step)
    return out


def unusable(entry: Mapping[str, Any]) -> dict[str, str]:
    """Precision -> why its fitted line must not be used for a prediction: no model fits (``model`` null,
    as ``mxperf fit`` withholds it), or a per-token or per-step cost below zero (the cost model's hard rule:
    a fixed cost below zero is left to the knee model)."""
    out = {}
    for prec in (entry["baseline"], entry["precision"]):
        fit = (entry.get("fits") or {}).get(prec) or {}
        hard = [m for m in implausible_reasons(fit) if not m.startswith("fixed cost")]
        if hard:
            out[prec] = "; ".join(hard)
        elif "model" in fit and fit.get("model") is None:
            out[prec] = str(fit.get("model_note") or "no model fits the data").removeprefix("no model: ")
    return out


CASE_WORDS = {
    "indistinguishable": "{low} and {base} are indistinguishable at the 95 % level",
    "undetermined": "the case is undetermined (no interval can be computed)",
    "always_faster": "{low} is faster than {base} at every micro-batch size",
    "never_faster": "{low} is never faster than {base}",
}
SUPPORTED = ("faster_above", "faster_below")


def step_crossing_words(
    entry: Mapping[str, Any],
    global_tokens: int,
    computed: float | None,
    sizes: Sequence[float],
    scenario: bool = False,
) -> str:
    """The step-level crossing for a global batch N, only where the fit's case has one.

    Without what-ifs, fits.json's ``step.step_breakeven`` entry for N (the same number ``mxperf fit``
    prints, with its interval) when there is one; else ``computed`` (``perfmodel.step.costs.step_breakeven``) only
    when the micro-batch case is faster_above / faster_below. A crossing outside the measured sizes is
    flagged as extrapolated; one above N is no micro-batch size of this global batch."""
    low, base = entry.get("precision", "low precision"), entry.get("baseline", "bf16")
    lo_size, hi_size = (min(sizes), max(sizes)) if sizes else (None, None)

    def where(n: float, ci: Sequence[float | None] | None = None) -> str:
        text = f"the step times cross at n = {tokens(n)} tokens"
        if ci and (ci[0] is not None or ci[1] is not None):
            text += f" ({_interval(ci)})"
        if n > global_tokens:
            return text + f", more than N = {global_tokens:,}: not reachable at this global batch."
        if lo_size is not None and not (lo_size <= n <= hi_size):
            text += (
                f" -- extrapolated: outside the measured sizes {tokens(lo_size)} to {tokens(hi_size)}, "
                "so the crossing rests on the fitted lines alone"
            )
        return text + "."

    step_be = next(
        (
            sb
            for sb in (entry.get("step") or {}).get("step_breakeven") or []
            if sb.get("global_batch_tokens") == global_tokens
        ),
        None,
    )
    if step_be is not None and not scenario:
        case = step_be.get("case")
        if case in SUPPORTED and step_be.get("tokens") is not None:
            return "From fits.json at this global batch: " + where(
                float(step_be["tokens"]), step_be.get("ci")
            )
        if case in SUPPORTED:
            return (
                f"No step-level crossing at N = {global_tokens:,}: {step_be.get('reason') or 'none found'}."
            )
        said = CASE_WORDS.get(str(case), f"the case is {case}").format(low=low, base=base)
        return (
            f"No step-level crossing at N = {global_tokens:,}: {said} (fits.json, per-step costs included), "
            "so the fitted lines' intersection is not shown."
        )
    be = entry.get("breakeven") or {}
    case = be.get("case")
    if case not in SUPPORTED:
        said = CASE_WORDS.get(str(case), f"the case is {case}").format(low=low, base=base)
        return f"No step-level crossing: {said}, so the fitted lines' intersection is not shown."
    if computed is None:
        return "With these settings the step times do not cross at a positive size."
    lead = (
        "What-if scenario: "
        if scenario
        else "From the fitted lines (fits.json has no step case for this N): "
    )
    return lead + where(computed)


def fit_label(fit_rel: str, entry: Mapping[str, Any]) -> str:
    return f"{fit_rel}: {entry.get('model')} / {entry.get('phase')} {entry.get('precision')} vs {entry.get('baseline')}"


@dataclass(frozen=True)
class FitLine:
    """One precision's fitted line from ``fits.json``, shaped for ``perfmodel.step.costs`` (which reads
    ``precision``, ``fixed_s``, ``per_token_s``, ``per_step_s`` and ``per_step_significant``), so the
    dashboard's what-ifs use the cost model's own rules."""

    precision: str
    fixed_s: float
    per_token_s: float
    per_step_s: float = 0.0
    per_step_significant: bool = False


def fit_lines(entry: Mapping[str, Any]) -> dict[str, FitLine]:
    """Baseline and low-precision lines of one ``fits.json`` model entry, baseline first."""
    fits = entry["fits"]
    out = {}
    for p in (entry["baseline"], entry["precision"]):
        f = fits[p]
        ci = f.get("per_step_ci") or [None, None]
        significant = ci[0] is not None and ci[1] is not None and (ci[0] > 0 or ci[1] < 0)
        out[p] = FitLine(
            p, float(f["fixed_s"]), float(f["per_token_s"]), float(f.get("per_step_s") or 0.0), significant
        )
    return out


WALL, GPU_BUSY = "wall clock", "GPU busy (host overhead removed)"


def bases(entry: Mapping[str, Any]) -> list[str]:
    """The bases this entry can be drawn on: wall clock always; GPU busy when fits.json has its lines."""
    fits = entry.get("fits") or {}
    busy = isinstance(entry.get("breakeven_gpu_busy"), Mapping) and all(
        isinstance(fits.get(p, {}).get("gpu_busy"), Mapping) for p in (entry["baseline"], entry["precision"])
    )
    return [WALL, GPU_BUSY] if busy else [WALL]


def basis_view(entry: Mapping[str, Any], basis: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(fits per precision, breakeven object, column of the points) for a basis."""
    if basis == GPU_BUSY:
        fits = {p: entry["fits"][p]["gpu_busy"] for p in (entry["baseline"], entry["precision"])}
        return fits, entry.get("breakeven_gpu_busy") or {}, "gpu_busy_seconds"
    return (
        {p: entry["fits"][p] for p in (entry["baseline"], entry["precision"])},
        entry.get("breakeven") or {},
        "seconds",
    )


def chosen_knee(fit: Mapping[str, Any]) -> dict[str, Any] | None:
    """The knee model of a precision when the data chose it (``model`` knee or parts), else None."""
    knee = fit.get("knee")
    if isinstance(knee, Mapping) and fit.get("model") in ("knee", "parts") and knee.get("left"):
        return dict(knee)
    return None


def knee_words(prec: str, fit: Mapping[str, Any]) -> str | None:
    """'mxfp8: the data chose a knee at 1,024 tokens (95 % CI 900 to 1,200): launch-bound below, ...'."""
    knee = chosen_knee(fit)
    if knee is None:
        return None
    ci = knee.get("knee_ci") or [None, None]
    where = f"{tokens(knee.get('knee_tokens'))} tokens" + (
        f" (95 % CI {tokens(ci[0])} to {tokens(ci[1])})" if ci[0] is not None else ""
    )
    return f"{prec}: the data chose a {fit.get('model')} model, knee at {where}; {knee.get('lines', '')}."


def size_options(smallest: float, largest: float) -> list[int]:
    """Powers of two from below ``smallest`` to above ``largest`` (slider stops for n and N)."""
    lo = 2 ** int(np.floor(np.log2(max(smallest, 1))))
    hi = 2 ** int(np.ceil(np.log2(max(largest, lo))))
    return [int(v) for v in 2 ** np.arange(np.log2(lo), np.log2(hi) + 1)]


def default_microbatch(options: Sequence[int], measured: Sequence[float], global_tokens: int) -> int:
    """The largest measured size that fits in N (inside the model), else the largest option <= N."""
    inside = [int(s) for s in measured if s <= global_tokens and int(s) in options]
    if inside:
        return max(inside)
    allowed = [o for o in options if o <= global_tokens]
    return allowed[-1] if allowed else options[0]


def sources_table(entry: Mapping[str, Any]) -> pd.DataFrame | None:
    """Which input and column each number came from (``sources`` in fits.json v2), None when absent."""
    src = entry.get("sources")
    if not isinstance(src, Mapping):
        return None
    return pd.DataFrame([{"number": k, "from": v if v else "not computed"} for k, v in src.items()])


def validation_misses(doc: dict[str, Any], rels: Sequence[str] = ()) -> list[str]:
    """One warning per step model whose prediction misses its run folders' measured steps (fits.json
    ``step_model[].validation.misses``: a whole step off by more than 10 % or outside its band), in the words
    ``mxperf fit`` prints (perfmodel.step.validation.validation_words). With ``rels``, only models whose
    misses name one of those run folders."""
    from perfmodel.step.validation import validation_words

    out = []
    for sm in doc.get("step_model") or []:
        v = sm.get("validation") if isinstance(sm, dict) else None
        misses = (v or {}).get("misses") or []
        if not misses:
            continue
        if rels and not any(
            str(m.get("run", "")).rstrip("/").endswith(tuple(f"/{r}" for r in rels))
            or str(m.get("run", "")) in rels
            for m in misses
        ):
            continue
        words = validation_words(v)
        if words:
            label = f"{sm.get('model', '?')}: {sm.get('precision', '?')} vs {sm.get('baseline', '?')}"
            out.append(f"{label}: {words}")
    return out


def step_model_of(doc: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """fits.json's ``step_model`` comparison of a ``models[]`` entry's model, baseline and precision, else None."""
    for sm in doc.get("step_model") or []:
        if isinstance(sm, dict) and all(
            sm.get(k) == entry.get(k) for k in ("model", "baseline", "precision")
        ):
            return sm
    return None


def run_label(path: str, runs_dir: Path | None = None, rels: Sequence[str] = ()) -> str:
    """A run folder as fits.json names it (the path given to ``mxperf fit``), relative to the runs directory
    where it can be: an absolute path inside ``runs_dir``, or a path ending in the name of one of its outputs
    (``rels``; the longest wins); else as given. An ingest's `` (precision)`` suffix is kept."""
    text = str(path)
    base, suffix = text, ""
    if m := re.fullmatch(r"(.+?)( \([^()/]+\))", text):
        base, suffix = m[1], m[2]
    base = base.rstrip("/")
    if runs_dir is not None and Path(base).is_absolute():
        try:
            rel = Path(base).relative_to(runs_dir).as_posix()
            if rel != ".":
                return rel + suffix
        except ValueError:
            pass
    tails = [r for r in rels if base == r or base.endswith(f"/{r}")]
    return (max(tails, key=len) if tails else base) + suffix


def validation_source(row: Mapping[str, Any]) -> str:
    """A row's kind as report.md's ``source`` column says it (the in-sample part of a fitted row added)."""
    part = row.get("in_sample_part")
    return f"{row['kind']}, {part} in-sample" if part else str(row["kind"])


def _band(ci: Sequence[float] | None) -> str:
    return f"[{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "none"


VALIDATION_COLUMNS = [
    "run",
    "phase",
    "precision",
    "source",
    "steps",
    "predicted s",
    "95 % band s",
    "measured s",
    "error %",
    "inside",
]


def validation_frame(
    v: Mapping[str, Any] | None, runs_dir: Path | None = None, rels: Sequence[str] = ()
) -> pd.DataFrame:
    """fits.json's predicted-vs-measured rows (``step_model[].validation.rows``) as a table, one row each and in
    their order, numbers as written (seconds, error in %): nothing is recomputed. Empty without rows."""
    rows = [
        {
            "run": run_label(r["run"], runs_dir, rels),
            "phase": r["phase"],
            "precision": r["precision"],
            "source": validation_source(r),
            "steps": int(r["steps"]),
            "predicted s": float(r["predicted_s"]),
            "95 % band s": _band(r.get("predicted_ci")),
            "measured s": float(r["measured_s"]),
            "error %": np.nan if r.get("error_pct") is None else float(r["error_pct"]),
            "inside": {True: "yes", False: "no"}.get(r.get("inside"), "no band"),
        }
        for r in (v or {}).get("rows") or []
    ]
    return pd.DataFrame(rows, columns=VALIDATION_COLUMNS)


def validation_numbers(
    v: Mapping[str, Any] | None, runs_dir: Path | None = None, rels: Sequence[str] = ()
) -> pd.DataFrame:
    """The rows of :func:`validation_frame` for a download: the band as two numbers (``band_lo_s``,
    ``band_hi_s``, NaN without one), fits.json's field names, ``inside`` as written (true / false / null)."""
    out = []
    for r in (v or {}).get("rows") or []:
        lo, hi = ([*(r.get("predicted_ci") or []), None, None])[:2]
        out.append(
            {
                "run": run_label(r["run"], runs_dir, rels),
                "run_in_fits_json": r["run"],
                "phase": r["phase"],
                "precision": r["precision"],
                "kind": r["kind"],
                "in_sample_part": r.get("in_sample_part"),
                "steps": int(r["steps"]),
                "predicted_s": float(r["predicted_s"]),
                "band_lo_s": np.nan if lo is None else float(lo),
                "band_hi_s": np.nan if hi is None else float(hi),
                "measured_s": float(r["measured_s"]),
                "error_pct": np.nan if r.get("error_pct") is None else float(r["error_pct"]),
                "inside": r.get("inside"),
            }
        )
    return pd.DataFrame(out)


def no_validation_words(doc: Mapping[str, Any], entry: Mapping[str, Any]) -> str | None:
    """Why fits.json has no predicted-vs-measured table for an entry's step comparison and how to get one;
    None when it has one."""
    sm = step_model_of(doc, entry)
    if sm is not None and ((sm.get("validation") or {}).get("rows")):
        return None
    how = (
        "`mxperf fit SWEEP RUN...` compares its step prediction with the run folders given after the sweep "
        f"(`mxperf run` outputs or ingested metric logs of {entry.get('model', '?')}, in "
        f"{entry.get('baseline', '?')} and {entry.get('precision', '?')}; not the traces its micro-batches "
        "came from, which would be in-sample)"
    )
    if "step_model" not in doc:
        return f"No predicted-vs-measured step table: this fits.json has no step model (an older mxperf fit). {how}."
    if sm is None:
        return f"No predicted-vs-measured step table: fits.json's step model has no comparison for this entry. {how}."
    if sm.get("reason"):
        return f"No predicted-vs-measured step table: no step prediction ({sm['reason']}). {how}."
    return f"No predicted-vs-measured step table: mxperf fit was given no run folder it could compare. {how}."
