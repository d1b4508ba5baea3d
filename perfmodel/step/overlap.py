"""How a step's phases add up: a colocated sampler runs them one after another, a separate one overlaps
generation with the learner's work.

Placements (``mxperf fit --placement``)::

    colocated   step = sum over phases X of t_X                               (today's rule; the default)
    separate    step = max(sampler side, learner side) + serial side
                sampler side = generate
                learner side = every other phase (reference, logprob, update, reward, other, ...)
                serial side  = sync and eval (neither side works while they run)
    no side      = generate_wait: an async trainer's wait for its sampler, max(0, generate - learner), which
                   the max already holds; never a term of the step (:data:`NOT_TERMS`)

``colocated`` is a hybrid engine (verl's default trainer, NeMo RL with ``colocated.enabled: true``):
sampler and learner share the GPUs, so generate, logprob, update and sync run in turn. ``separate`` is a
sampler on its own GPUs whose next generation overlaps the learner's work on the current batch, as these
trainers schedule it (read at verl-project/verl 1dda039b9c63 and NVIDIA-NeMo/RL 7ea279abfbeb):

- verl one-step-off-policy (``verl/experimental/one_step_off_policy/ray_trainer.py``, ``fit_step`` and
  ``_fit_generate``): wait for the generation launched one step earlier (timer ``gen``), sync the weights
  (``sync_rollout_weights``), launch the next generation (``_async_gen_next_batch``, whose timer
  ``generate_async`` holds the awaited generation), then reward, ``old_log_prob``, ref, critic and
  ``update_actor`` on the learner's GPUs. Generation k starts when the learner starts on batch k - 1, so the
  wait is ``max(0, G - L)`` and ``step = wait + sync + L = max(G, L) + sync``; its README states the same
  ("one-step-overlap async: step ~ wait_prev_gen + old_log_prob + update_actor").
- verl fully-async (``verl/experimental/fully_async_policy``, README and ``fully_async_trainer.py``):
  Rollouter and Trainer on separate resources; the trainer waits on the sample queue (``gen``), trains,
  then ``param_sync`` with the rollouter paused (partial rollout: sleep / resume). With
  ``staleness_threshold: 0`` and ``trigger_parameter_sync_step: 1`` it is on-policy and nothing overlaps:
  that run is ``colocated`` here, whatever its GPUs.
- NeMo RL async GRPO (``docs/guides/async-grpo.md``; ``nemo_rl/algorithms/grpo.py`` ``async_grpo_train``):
  needs ``colocated.enabled: false``; the trajectory collector generates in the background while the
  trainer runs ``policy_and_reference_logprobs`` and ``policy_training`` after waiting
  ``exposed_generation``; at the refit the collector pauses (``prepare_for_refit``) and ``weight_sync`` runs
  alone. Its own ``print_performance_metrics`` (``nemo_rl/algorithms/utils.py``) takes an async step's
  generation time as ``exposed_generation + logprobs + training``, i.e. ``max(generation, learner)``.
  ``in_flight_weight_updates`` lets the sync overlap generation too; that variant is not modelled.

Where the gain comes from (``gain_by_phase``) with overlap: a phase's change reaches the step only while its
side is the longer one. Each side gets the Shapley share of the change of ``max(sampler, learner)`` (the
mean over the two orders of changing the sampler and the learner side), which is its change times its
**weight**: the mean, over the other side's two values, of the part of its own change that lies above the
other side. A phase's share is its own change times its side's weight (serial phases: weight 1), over the
baseline step; the shares add up to the gain exactly. A faster sampler while the learner is the longer side
in both precisions gives 0; a side that is the longer one throughout counts in full.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracing.ingest.metric_logs import SAMPLER_WAIT
from tracing.outputs.errors import InputError

COLOCATED, SEPARATE = "colocated", "separate"
PLACEMENTS = (COLOCATED, SEPARATE)
SAMPLER_SIDE = frozenset({"generate"})
SERIAL_SIDE = frozenset({"sync", "eval"})
NOT_TERMS = frozenset({SAMPLER_WAIT})  # measured, but inside max(sampler, learner): never added
DEFAULT_SOURCE = (
    "default: a colocated sampler (hybrid engine: phases run one after another); --placement separate for a "
    "sampler on its own GPUs"
)
UNSURE = (0.1, 0.9)  # a side longer in a share of replicates between these: which side binds is uncertain


@dataclass(frozen=True)
class Placement:
    """The placement of one comparison and where it came from (a flag, an input, the default)."""

    name: str = COLOCATED
    source: str = DEFAULT_SOURCE

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "source": self.source}


def parse_placement(value: str | None) -> str | None:
    """``--placement`` (None: not given); anything but the two names raises one line naming the flag."""
    if value is None or value in PLACEMENTS:
        return value
    raise InputError(f"--placement {value!r}: choose {' or '.join(PLACEMENTS)}")


def side_of(phase: str) -> str:
    """``sampler``, ``serial`` or ``learner`` (every phase not named in the first two)."""
    if phase in SAMPLER_SIDE:
        return "sampler"
    return "serial" if phase in SERIAL_SIDE else "learner"


def sides(phases: Mapping[str, Any]) -> dict[str, Any]:
    """Seconds of each side (floats or equal-length replicate arrays; a side without phases is 0)."""
    out: dict[str, Any] = {"sampler": 0.0, "learner": 0.0, "serial": 0.0}
    for ph, t in phases.items():
        out[side_of(ph)] = out[side_of(ph)] + t
    return out


def combine(phases: Mapping[str, Any], placement: str) -> Any:
    """The step's seconds from its phases' (floats, or replicate arrays: the max is taken per replicate)."""
    if placement == COLOCATED:
        return sum(phases.values())
    s = sides(phases)
    return np.maximum(s["sampler"], s["learner"]) + s["serial"]


def reduction(phases: Mapping[str, Any], cuts: Mapping[str, Any], placement: str) -> Any:
    """How much shorter the step gets when each phase ``X`` in ``cuts`` takes ``cuts[X]`` seconds less."""
    if placement == COLOCATED:
        return sum(cuts.values())
    cut = {ph: t - cuts.get(ph, 0.0) for ph, t in phases.items()}
    return combine(phases, placement) - combine(cut, placement)


def _above(a: float, b: float, level: float) -> float:
    """The part of the span between ``a`` and ``b`` that lies above ``level`` (an empty span: 1 above,
    1/2 at, 0 below)."""
    lo, hi = min(a, b), max(a, b)
    if hi - lo <= 1e-12 * max(abs(hi), 1.0):
        return 1.0 if lo > level else 0.5 if lo == level else 0.0
    return float(np.clip((hi - level) / (hi - lo), 0.0, 1.0))


def side_weights(base: Mapping[str, float], low: Mapping[str, float], placement: str) -> dict[str, float]:
    """Per side, the share of its change that reaches the step (the module docstring)."""
    if placement == COLOCATED:
        return {"sampler": 1.0, "learner": 1.0, "serial": 1.0}
    b, lo = sides(base), sides(low)
    s = [_above(b["sampler"], lo["sampler"], c) for c in (b["learner"], lo["learner"])]
    ln = [_above(b["learner"], lo["learner"], c) for c in (b["sampler"], lo["sampler"])]
    return {"sampler": float(np.mean(s)), "learner": float(np.mean(ln)), "serial": 1.0}


def gain_by_phase(
    base: Mapping[str, float], low: Mapping[str, float], base_step: float, placement: str
) -> dict[str, float]:
    """Each phase's share of the gain ``1 - step_low / step_base`` (they add up to it)."""
    if placement == COLOCATED:
        return {ph: (base[ph] - low[ph]) / base_step for ph in base}
    w = side_weights(base, low, placement)
    return {ph: w[side_of(ph)] * (base[ph] - low[ph]) / base_step for ph in base}


def binds(phases: Mapping[str, float]) -> str:
    """The longer of the two overlapping sides: ``sampler``, ``learner`` or ``tie``."""
    s = sides(phases)
    if np.isclose(s["sampler"], s["learner"], rtol=1e-9, atol=0.0):
        return "tie"
    return "sampler" if s["sampler"] > s["learner"] else "learner"


def learner_weight(phases: Mapping[str, float], placement: str) -> float:
    """How much of a change of the learner side reaches the step here: 1, 1/2 (a tie) or 0."""
    if placement == COLOCATED:
        return 1.0
    return {"learner": 1.0, "tie": 0.5, "sampler": 0.0}[binds(phases)]


def overlap_entry(
    base: Mapping[str, float],
    low: Mapping[str, float],
    reps: Mapping[str, Mapping[str, np.ndarray]] | None,
    names: tuple[str, str],
    placement: str,
) -> dict[str, Any] | None:
    """``settings[].overlap`` (separate only): per precision the sides' seconds and the longer side, the
    share of replicates where the sampler is longer, and the sides' weights in ``gain_by_phase``."""
    if placement == COLOCATED:
        return None
    out: dict[str, Any] = {"per_precision": {}, "weights": side_weights(base, low, placement)}
    for name, ph in zip(names, (base, low), strict=True):
        s = sides(ph)
        entry = {
            "sampler_s": float(s["sampler"]),
            "learner_s": float(s["learner"]),
            "serial_s": float(s["serial"]),
        }
        entry["binds"] = binds(ph)
        if reps is not None and name in reps:
            r = sides(reps[name])
            longer = np.asarray(r["sampler"], float) > np.asarray(r["learner"], float)
            entry["sampler_longer_share"] = float(np.mean(longer)) if longer.size else None
        out["per_precision"][name] = entry
    return out


def formula(phases: list[str], placement: str) -> str:
    """``generate + update + sync`` (colocated) or ``max(generate, logprob + update) + sync`` (separate)."""
    if placement == COLOCATED or not any(side_of(ph) == "sampler" for ph in phases):
        return " + ".join(phases)
    part = {k: [ph for ph in phases if side_of(ph) == k] for k in ("sampler", "learner", "serial")}
    inner = ", ".join(" + ".join(part[k]) for k in ("sampler", "learner") if part[k])
    head = f"max({inner})" if part["learner"] else inner
    return " + ".join([head, *part["serial"]])


def binding_words(overlap: Mapping[str, Any] | None, base: str, low: str) -> str:
    """Which side binds, in words for the answer (empty for a colocated step)."""
    if not overlap:
        return ""
    pp = overlap["per_precision"]
    b, lo = pp[base]["binds"], pp[low]["binds"]
    if b == lo == "learner":
        said = "the learner is the longer side in both precisions, so a faster sampler gives nothing"
    elif b == lo == "sampler":
        said = "generation is the longer side in both precisions, so the learner's change is hidden"
    else:
        said = (
            f"the longer side is {_SIDE[b]} for {base} and {_SIDE[lo]} for {low}: each side's change counts "
            "for the part of it during which that side is the longer"
        )
    unsure = [
        p
        for p in (base, low)
        if (x := pp[p].get("sampler_longer_share")) is not None and UNSURE[0] < x < UNSURE[1]
    ]
    if unsure:
        said = "at the point estimates " + said
        said += "; which side is longer is uncertain for " + ", ".join(
            f"{p} (the sampler in {100 * pp[p]['sampler_longer_share']:.0f} % of replicates)" for p in unsure
        )
    return said


_SIDE = {"sampler": "the sampler", "learner": "the learner", "tie": "neither (a tie)"}


def choose(flag: str | None, evidence: Mapping[str, str]) -> tuple[Placement, list[str]]:
    """The placement of one comparison: ``--placement``, else ``separate`` where an input says so
    (``evidence``: source -> why, the why naming the file), else the default; and notes where the flag overrides an input."""
    said = "; ".join(sorted(set(evidence.values())))
    if flag is not None:
        notes = [f"--placement {flag} used, though {said}"] if said and flag == COLOCATED else []
        return Placement(flag, "--placement"), notes
    if said:
        return Placement(SEPARATE, f"the inputs: {said}"), []
    return Placement(), []
