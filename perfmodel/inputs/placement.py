"""Which inputs say their steps ran with a separate sampler: metric logs of async trainers, known by timers
that only those trainers log (the step model's placement, :mod:`perfmodel.step.overlap`).

Signals (read at verl-project/verl 1dda039b9c63 and NVIDIA-NeMo/RL 7ea279abfbeb), per ingested metric log
(its manifest entry's ``framework`` and ``phase_keys``):

- verl ``timing_s/generate_async``: timed only by the one-step-off-policy trainer
  (``verl/experimental/one_step_off_policy/ray_trainer.py``, ``_async_gen_next_batch``), whose generation
  always overlaps the learner's previous batch;
- NeMo RL ``timing/train/exposed_generation``: timed only by its async loops (``async_grpo_train`` in
  ``nemo_rl/algorithms/grpo.py``, async PPO, the single controller), which need ``colocated.enabled: false``;
  its own ``print_performance_metrics`` tells async from sync steps by this timer.

Not a signal: verl's fully-async trainer (``timing_s/param_sync``) runs on-policy, with nothing overlapping,
at ``staleness_threshold: 0`` and ``trigger_parameter_sync_step: 1``, and its log does not say which;
``mxperf run --async`` may share one device between sampler and learner. Give ``--placement`` for those.
What their timers measure: verl's ``generate_async`` is the generation (phase ``generate``), its ``gen`` the
trainer's wait for it (``generate_wait``); NeMo RL's ``exposed_generation`` is the wait (``generate_wait``)
and the generation time is not logged (:mod:`tracing.analysis.logged_steps`).
"""

from __future__ import annotations

from typing import Any

ASYNC_TIMERS: dict[str, dict[str, str]] = {
    "verl": {"timing_s/generate_async": "verl one-step-off-policy trainer (timer timing_s/generate_async)"},
    "nemo_rl": {"timing/train/exposed_generation": "NeMo RL async GRPO (timer exposed_generation)"},
}


def _timer_keys(trace: dict[str, Any]) -> set[str]:
    return {str(k) for keys in (trace.get("phase_keys") or {}).values() for k in keys or []}


def separate_sampler_logs(manifest: dict[str, Any]) -> dict[str, str]:
    """Precision label -> why its metric logs ran with a separate sampler (logs without a precision label
    are no phase source, so they are not named)."""
    common = (manifest.get("config") or {}).get("labels") or {}
    out: dict[str, list[str]] = {}
    for t in manifest.get("traces") or []:
        signals = ASYNC_TIMERS.get(str(t.get("framework")), {})
        found = [why for key, why in signals.items() if key in _timer_keys(t)]
        prec = {**common, **(t.get("labels") or {})}.get("precision")
        if found and prec:
            out.setdefault(str(prec), []).append(f"{t.get('path')}: {', '.join(found)}")
    return {p: "; ".join(sorted(v)) for p, v in out.items()}
