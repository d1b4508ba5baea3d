"""verl / NeMo RL metric logs -> per-step numbers, for phase times and sampler/learner mismatch without a trace.

Layouts, keys and the token-count arithmetic: docs/tracing.md, "Metric logs". A value logged as null, NaN or
+-inf is unknown (NaN); a step logged twice (a resumed run) keeps its later lines, and the notes say which. The
keys each framework logs (:data:`FRAMEWORKS`) decide which file is which; a file with none of them, a line that
is not JSON, a line without a step, or a timer or token key that is not a number (or is negative) is an
:class:`InputError` naming the file and the line. A derived token count is kept only when it is a whole number
within the rounding of the logged values (float32), else None (and noted).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracing.outputs.errors import InputError

METRIC_LOG = "metric_log"  # the format name (tracing.ingest.detect)
SAMPLER_WAIT = "generate_wait"  # the phase of an async trainer's wait for its separate sampler
_SNIFF_BYTES = 1 << 16
_JSON_LINE_START = re.compile(rb'^\s*\{\s*"(?:step|_step)"\s*:\s*-?\d')  # verl FileLogger / flat lines
_TAG_STEP_START = re.compile(rb'^\s*\{\s*"[^"]*"\s*:\s*\{\s*"\d+"\s*:')  # NeMo RL {"tag": {"1": ...}}
CONSOLE_SUFFIXES = (".log", ".txt", ".out")  # where verl's console lines are looked for
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CONSOLE_LINE = re.compile(r"^(?:\([^()]*\)\s*)*step:(\d+) - (.*)$")  # after an optional Ray prefix
_CONSOLE_SNIFF = re.compile(rb"step:\d+ - [^\s:]+:")
_NUMPY_SCALAR = re.compile(r"^np\.\w+\((.*)\)$")  # numpy 2's repr: np.float64(1.5)


@dataclass(frozen=True)
class FrameworkKeys:
    """How one framework logs per-step timers and mismatch metrics (read from its sources)."""

    name: str
    timing_prefix: str  # timer key = prefix + timer name
    step_total: str  # the timer around the whole step
    nested: re.Pattern[str]  # timers that run inside another logged timer (summing them counts twice)
    not_seconds: re.Pattern[str]  # keys under the timing prefix that are not durations
    mismatch: dict[str, str]  # logged key -> metric name (mxperf's name where the formula is the same)
    mismatch_prefix: str  # every key under it is a mismatch metric, named without the prefix
    token_keys: frozenset[str]  # counts and lengths the token counts come from (numbers >= 0)
    waits: frozenset[str] = frozenset()  # timers that are the trainer's wait for a separate sampler
    beside_step: str = ""  # the timer of a generation that runs beside the step (overlapping the learner)
    inside_where: tuple[tuple[str, str], ...] = ()  # (timer, outer): inside outer where both are logged

    def timer(self, key: str) -> str | None:
        """The timer name of a timing key (``timing_s/gen`` -> ``gen``), None for any other key."""
        if not key.startswith(self.timing_prefix):
            return None
        name = key[len(self.timing_prefix) :]
        while name.startswith(self.timing_prefix):  # verl's fully-async trainer times "timing_s/param_sync"
            name = name[len(self.timing_prefix) :]
        return None if self.not_seconds.search(name) else name

    def nested_in(self, name: str, timers: Collection[str]) -> bool:
        """Whether timer ``name`` runs inside another logged timer, given the log's ``timers`` (names)."""
        if self.nested.search(name):
            return True
        return any(name == inner and outer in timers for inner, outer in self.inside_where)

    def sampler_waits(self, generation: Collection[str]) -> frozenset[str]:
        """Of a log's generation timers (names), those that are the trainer's wait for a separate sampler:
        the framework's :attr:`waits`, and in a log that times the generation beside the step
        (:attr:`beside_step`) every other one."""
        beside = bool(self.beside_step) and self.beside_step in generation
        return frozenset(t for t in generation if t in self.waits or (beside and t != self.beside_step))

    def mismatch_metric(self, key: str) -> str | None:
        if key in self.mismatch:
            return self.mismatch[key]
        if self.mismatch_prefix and key.startswith(self.mismatch_prefix):
            return key[len(self.mismatch_prefix) :]
        return None


# verl timers whose timing_per_token_ms divides by the batch's prompt + response tokens (metric_utils.py).
_VERL_ALL_TOKEN_TIMERS = ("update_actor", "ref", "values", "adv", "update_critic")

FRAMEWORKS: dict[str, FrameworkKeys] = {
    # verl-project/verl 1dda039: ppo/metric_utils.py compute_timing_metrics; the rollout worker's own timers
    # (generate_sequences, generation_timing/*, agent_loop/*) come back inside "gen". Mismatch:
    # utils/debug/metrics.py, ppo/rollout_corr_helper.py (formulas: docs/tracing.md).
    "verl": FrameworkKeys(
        name="verl",
        timing_prefix="timing_s/",
        step_total="step",
        nested=re.compile(r"/|^generate_sequences$"),
        not_seconds=re.compile(r"(?!)"),
        mismatch={
            "training/rollout_probs_diff_mean": "prob_abs_diff_mean",
            "training/rollout_probs_diff_max": "prob_abs_diff_max",
            "training/rollout_probs_diff_std": "prob_abs_diff_std",
            "training/rollout_actor_probs_pearson_corr": "rollout_actor_probs_pearson_corr",
            "rollout_corr/kl": "kl_k1",
            "rollout_corr/k3_kl": "kl_k3",
        },
        mismatch_prefix="rollout_corr/",
        token_keys=frozenset(
            {"perf/total_num_tokens", "prompt_length/mean", "response_length/mean"}
            | {f"timing_per_token_ms/{n}" for n in ("gen", *_VERL_ALL_TOKEN_TIMERS)}
        ),
        # one_step_off_policy/ray_trainer.py: "generate_async" runs while the learner works; "gen" is the wait
        beside_step="generate_async",
        # the one-step-off trainer calls _fit_update_weights inside its "sync_rollout_weights" timer
        inside_where=(("update_weights", "sync_rollout_weights"),),
    ),
    # NVIDIA-NeMo/RL 7ea279a: algorithms/grpo.py (Timer labels, summed per step), loss/loss_functions.py.
    # "<group>/<part>" times a part of another timer; "*/total" and "idle/*" (async waits) are top-level.
    "nemo_rl": FrameworkKeys(
        name="nemo_rl",
        timing_prefix="timing/train/",
        step_total="total_step_time",
        nested=re.compile(r"^(?!idle/)(?!.*/total$).*/"),
        not_seconds=re.compile(r"per_sec|_pct$"),
        mismatch={
            f"train/{k}": k
            for k in (
                "token_mult_prob_error",
                "gen_kl_error",
                "policy_kl_error",
                "js_divergence_error",
                "sampling_importance_ratio",
                "max_seq_mult_prob_error",
                "mean_seq_mult_prob_error",
                "min_seq_mult_prob_error",
                "max_seq_mult_prob_error_after_mask",
                "mean_seq_mult_prob_error_after_mask",
                "min_seq_mult_prob_error_after_mask",
            )
        },
        mismatch_prefix="",
        token_keys=frozenset(
            {
                "train/total_turns",
                "train/avg_turns_per_sample",
                "train/mean_gen_tokens_per_sample",
                "train/mean_prompt_length",
            }
        ),
        # async_grpo_train: the wait for the replay buffer and pending generation (generation itself: unlogged)
        waits=frozenset({"exposed_generation"}),
    ),
}


@dataclass(frozen=True)
class MetricLog:
    """One metric log: ``steps[step][key]`` = value (numbers only; a logged null is NaN)."""

    path: str
    framework: str  # a key of FRAMEWORKS
    layout: str  # verl_file_logger | json_lines | nemo_rl_json | verl_console
    steps: dict[int, dict[str, float]]
    notes: tuple[str, ...] = ()  # what reading it decided (steps logged twice)

    @property
    def keys(self) -> FrameworkKeys:
        return FRAMEWORKS[self.framework]


def _unreadable(exc: Exception) -> str:
    """What is wrong with JSON text that ``json.loads`` refused without a JSONDecodeError."""
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply to decode: not a verl / NeMo RL metric log"
    return f"unreadable JSON ({exc})"


def is_metric_log(path: str | os.PathLike[str]) -> bool:
    """True when the file starts like one of the layouts above (a ``.jsonl`` always counts)."""
    p = Path(path)
    if not p.is_file():
        return False
    if p.suffix == ".jsonl":
        return True
    if p.suffix in CONSOLE_SUFFIXES:
        return has_console_steps(p)
    if p.suffix != ".json":
        return False
    with open(p, "rb") as fh:
        head = fh.read(_SNIFF_BYTES)
    return bool(_TAG_STEP_START.match(head)) or _has_step(head)


def has_console_steps(path: str | os.PathLike[str]) -> bool:
    """True when a text file holds a verl console step line (``step:N - key:value``) anywhere."""
    with open(path, "rb") as fh:
        return any(b"step:" in line and _CONSOLE_SNIFF.search(line) for line in fh)


def looks_like_metric_lines(path: str | os.PathLike[str]) -> bool:
    """True when a file's first record is an object with a step (a directory may also hold other JSON lines:
    NeMo RL's per-sample ``train_data_step<N>.jsonl``)."""
    with open(path, "rb") as fh:
        return _has_step(fh.read(_SNIFF_BYTES))


def _has_step(head: bytes) -> bool:
    if _JSON_LINE_START.match(head):
        return True
    line, newline, _ = head.partition(b"\n")
    if not newline and len(head) == _SNIFF_BYTES:
        return False  # a first line longer than the sniff (a one-line Kineto trace): not a metric record
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, an integer of > 4300 digits, nested too deep
        return False
    return isinstance(rec, dict) and ("step" in rec or "_step" in rec) and "traceEvents" not in rec


def load_metric_log(path: str | os.PathLike[str]) -> MetricLog:
    """Read a verl / NeMo RL metric log (any layout above)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except UnicodeDecodeError:
        raise InputError(f"{p}: not UTF-8 text, so not a verl / NeMo RL metric log") from None
    if not text.strip():
        raise InputError(f"{p}: empty metric log")
    again: set[int] = set()
    if _TAG_STEP_START.match(text.encode()[:_SNIFF_BYTES]):
        steps, layout, first = _tag_steps(p, text), "nemo_rl_json", "its first tag"
    elif p.suffix in CONSOLE_SUFFIXES:
        steps, layout, first = _console_steps(p, text, again), "verl_console", "its first step line"
    else:
        steps, layout, first = _line_steps(p, text, again)
    notes = ()
    if again:
        shown = ", ".join(str(s) for s in sorted(again)[:8]) + (" ..." if len(again) > 8 else "")
        notes = (f"step(s) {shown} logged twice with other values (a resumed run?): the later lines kept",)
    return MetricLog(str(p), _framework_of(p, steps, first), layout, steps, notes)


def _merge(steps: dict[int, dict[str, float]], step: int, values: dict[str, float], again: set[int]) -> None:
    """Add one line's values to its step; a value the step already has, logged again differently, marks the
    step as logged twice (the later value is kept)."""
    held = steps.setdefault(step, {})
    if any(
        k in held and held[k] != v and not (math.isnan(v) and math.isnan(held[k])) for k, v in values.items()
    ):
        again.add(step)
    held.update(values)


def _console_steps(p: Path, text: str, again: set[int]) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if "step:" not in raw:
            continue
        m = _CONSOLE_LINE.match(_ANSI.sub("", raw).strip())
        if m is None:
            continue  # other console output
        data: dict[str, Any] = {}
        for item in m.group(2).split(" - "):
            key, colon, value = item.rpartition(":")
            if not colon:
                continue
            value = value.strip()
            unwrapped = _NUMPY_SCALAR.match(value)
            text_value = unwrapped.group(1) if unwrapped else value
            try:
                data[key.strip()] = float(text_value)
            except ValueError:
                data[key.strip()] = text_value  # _numbers refuses it where it is a timer or token key
        _merge(steps, int(m.group(1)), _numbers(p, f"line {lineno}", data), again)
    if not steps:
        raise InputError(f"{p}: no verl console step line (step:N - key:value - ...)")
    return steps


def _line_steps(p: Path, text: str, again: set[int]) -> tuple[dict[int, dict[str, float]], str, str]:
    steps: dict[int, dict[str, float]] = {}
    layout, first = "json_lines", ""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or (lineno == 1 and line.lstrip().startswith("#")):
            continue  # blank, or a header comment
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{p}: line {lineno}: not JSON ({exc.msg}); truncated or corrupt") from None
        except (RecursionError, ValueError) as exc:  # ValueError: an integer of more than 4300 digits
            raise InputError(f"{p}: line {lineno}: {_unreadable(exc)}") from None
        if not isinstance(rec, dict):
            raise InputError(f"{p}: line {lineno}: a JSON {type(rec).__name__}, not an object with a step")
        step_key = "step" if "step" in rec else "_step" if "_step" in rec else None
        if step_key is None:
            raise InputError(
                f'{p}: line {lineno}: no \'step\' (verl\'s file logger writes {{"step": N, "data": {{...}}}})'
            )
        step = _step_number(rec[step_key])
        if step is None:
            raise InputError(
                f"{p}: line {lineno}: step {rec[step_key]!r} is not a whole number from 0 to 2^62"
            )
        data = rec.get("data") if "data" in rec and len(rec) == 2 else None
        if data is not None:
            layout = "verl_file_logger"
            if not isinstance(data, dict):
                raise InputError(f"{p}: line {lineno}: 'data' is not an object of metrics")
        else:
            data = {k: v for k, v in rec.items() if k != step_key}
        first = first or f"line {lineno}"
        _merge(steps, step, _numbers(p, f"line {lineno}", data), again)
    return steps, layout, first


def _tag_steps(p: Path, text: str) -> dict[int, dict[str, float]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{p}: line {exc.lineno}: not JSON ({exc.msg}); truncated or corrupt") from None
    except (RecursionError, ValueError) as exc:
        raise InputError(f"{p}: {_unreadable(exc)}") from None
    if not isinstance(doc, dict):
        raise InputError(f"{p}: not a JSON object of {{tag: {{step: value}}}}")
    steps: dict[int, dict[str, float]] = {}
    for tag, series in doc.items():
        if not isinstance(series, dict):
            raise InputError(f"{p}: tag {tag!r}: not an object of {{step: value}}")
        for raw_step, value in series.items():
            step = _step_number(raw_step)
            if step is None:
                raise InputError(f"{p}: tag {tag!r}: step {raw_step!r} is not a whole number from 0 to 2^62")
            steps.setdefault(step, {}).update(_numbers(p, f"tag {tag!r} step {step}", {tag: value}))
    return steps


def _step_number(value: Any) -> int | None:
    """A whole step number >= 0 that the int64 step column holds (at most ``2**62``), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isdigit() and len(value) < 19:
        step = int(value)
    elif isinstance(value, int):
        step = value
    elif isinstance(value, float) and value.is_integer():
        step = int(value)
    else:
        return None
    return step if 0 <= step <= 2**62 else None


def _numbers(p: Path, where: str, data: dict[str, Any]) -> dict[str, float]:
    """The numeric values of ``data``; a timer or mismatch key with another value is an error."""
    out: dict[str, float] = {}
    fws = FRAMEWORKS.values()
    for key, value in data.items():
        timer = any(fw.timer(key) is not None for fw in fws)
        token = any(key in fw.token_keys for fw in fws)
        if value is None:
            out[key] = math.nan  # verl's orjson writes NaN as null
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
            if not math.isfinite(number):  # NaN, Infinity (Python's JSON writes them): unknown
                number = math.nan
            elif number < 0 and (timer or token):
                what = "s is a negative duration" if timer else "is a negative token or sequence count"
                raise InputError(f"{p}: {where}: {key} = {value!r} {what}")
            out[key] = number
        elif timer or token or any(fw.mismatch_metric(key) for fw in fws):
            raise InputError(f"{p}: {where}: {key} = {value!r} is not a number")
    return out


def _framework_of(p: Path, steps: dict[int, dict[str, float]], first: str) -> str:
    counts = {name: 0 for name in FRAMEWORKS}
    seen: list[str] = []
    for values in steps.values():
        for key in values:
            for name, fw in FRAMEWORKS.items():
                counts[name] += fw.timer(key) is not None or fw.mismatch_metric(key) is not None
            if len(seen) < 6 and key not in seen:
                seen.append(key)
    best = max(counts.values())
    if best == 0:
        raise InputError(
            f"{p}: {first}: no verl (timing_s/*, rollout_corr/*, training/rollout_probs_diff_*) or NeMo RL "
            f"(timing/train/*, train/token_mult_prob_error, train/gen_kl_error) key in any step"
            + (f" (keys seen: {', '.join(seen)})" if seen else " (no numeric values)")
        )
    winners = [name for name, n in counts.items() if n == best]
    if len(winners) > 1:
        raise InputError(f"{p}: as many verl as NeMo RL keys; cannot tell which framework wrote it")
    return winners[0]


TOKEN_FIELDS = ("prompt_tokens", "generated_tokens", "sequences")
_ROUNDING = 2.0**-21  # relative: a few float32 ulps (TensorBoard scalars, torch float32 means)


@dataclass(frozen=True)
class StepTokens:
    """One step's generation batch as the log gives it; None where it does not say."""

    prompt_tokens: int | None
    generated_tokens: int | None
    sequences: int | None


def step_tokens(log: MetricLog) -> tuple[dict[int, StepTokens], tuple[str, ...]]:
    """Per step that gives any count, its :class:`StepTokens`; and notes on derived counts left out."""
    derive = _verl_counts if log.framework == "verl" else _nemo_rl_counts
    out: dict[int, StepTokens] = {}
    odd: dict[str, list[tuple[int, float]]] = {}
    for step in sorted(log.steps):
        counts: dict[str, int | None] = {}
        for name, raw in zip(TOKEN_FIELDS, derive(log.steps[step]), strict=True):
            counts[name] = _whole(raw)
            if raw is not None and counts[name] is None:
                odd.setdefault(name, []).append((step, raw))
        if any(v is not None for v in counts.values()):
            out[step] = StepTokens(**counts)
    notes = tuple(
        f"step(s) {', '.join(str(s) for s, _ in got[:5])}{' ...' if len(got) > 5 else ''}: "
        f"{name.replace('_', ' ')} from the logged keys is not a whole number >= 0 ({got[0][1]:.6g} at step "
        f"{got[0][0]}): left unknown"
        for name, got in odd.items()
    )
    return out, notes


def _whole(x: float | None) -> int | None:
    """``x`` as a whole number >= 0 when it is one within the rounding of logged values, else None."""
    if x is None or not math.isfinite(x) or x < -0.5:
        return None
    n = round(x)
    return n if abs(x - n) <= 0.01 + _ROUNDING * abs(x) else None


def _finite(values: dict[str, float], key: str) -> float | None:
    v = values.get(key)
    return v if v is not None and math.isfinite(v) else None


def _verl_per_token(values: dict[str, float], timer: str) -> float | None:
    """The tokens verl divided ``timing_s/<timer>`` by: seconds * 1000 / ``timing_per_token_ms/<timer>``."""
    seconds = _finite(values, f"timing_s/{timer}")
    ms = _finite(values, f"timing_per_token_ms/{timer}")
    return seconds * 1000.0 / ms if seconds and ms else None


def _verl_counts(values: dict[str, float]) -> tuple[float | None, float | None, float | None]:
    generated = _verl_per_token(values, "gen")
    total = _finite(values, "perf/total_num_tokens")
    for timer in _VERL_ALL_TOKEN_TIMERS:
        total = total if total is not None else _verl_per_token(values, timer)
    prompt = total - generated if total is not None and generated is not None else None
    pm, rm = _finite(values, "prompt_length/mean"), _finite(values, "response_length/mean")
    per_sequence = pm + rm if pm is not None and rm is not None else None
    sequences = total / per_sequence if total is not None and per_sequence else None
    return prompt, generated, sequences


def _nemo_rl_counts(values: dict[str, float]) -> tuple[float | None, float | None, float | None]:
    turns, per = _finite(values, "train/total_turns"), _finite(values, "train/avg_turns_per_sample")
    sequences = turns / per if turns is not None and per else None
    gen = _finite(values, "train/mean_gen_tokens_per_sample")
    prompt = _finite(values, "train/mean_prompt_length")
    return (
        sequences * prompt if sequences is not None and prompt is not None else None,
        sequences * gen if sequences is not None and gen is not None else None,
        sequences,
    )
