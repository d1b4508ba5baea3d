"""One RL step, instrumented: generate -> learner log-probs -> mismatch metrics -> update -> sync -> checks.

    step t ──┬─ generate        sampler (weights v_t) samples n responses per prompt, per-token log-probs
             ├─ logprob         learner's full-sequence log-probs of the same tokens (pi_old)
             │                  -> kl_k1, kl_k3, token_mult_prob_error, prob_abs_diff_mean/max, reward
             ├─ update          GRPO over micro-batches (update/microbatch ranges inside the learner)
             └─ sync            learner export -> bytes -> sampler.update_weights(v_{t+1})
                  └─ sync/check invariants I1-I7 against the live sampler (``--check-sync``)

Each phase is a named range of one :class:`tracing.capture.ranges.RangeLog` (host log always; NVTX on CUDA;
record_function under a profiler). In async mode the next step's generation is submitted before this step's
update, so the sync of v_{t+1} arrives while those requests are in flight (the sampler must drain them).

The session only talks to ``LearnerBackend`` / ``SamplerEngine`` (``pipeline.interfaces``) and to the sync
driver (``pipeline.sync.weight_sync.WeightSync``) and checker (``pipeline.sync.invariants.check_sync``), both
injectable, so other engines -- and the fault injector -- plug in without touching this file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from pipeline.experiments.mismatch import kl_k3_stderr, mismatch_metrics
from pipeline.experiments.session import Session
from pipeline.interfaces import Rollout, SamplingParams
from pipeline.learner.rollouts import build_grpo_batch, pad_sequences, place_logprobs
from tracing.outputs.errors import InputError


class SyncCheckFailedError(InputError):
    """A weight-sync invariant failed and the run was started with --strict."""


CHECK_POLICIES = ("every", "first", "off")


@dataclass
class StepResult:
    metrics: dict[str, Any]
    check_rows: list[dict[str, Any]]


def _ns_to_s(ns: int) -> float:
    return ns / 1e9


class RLLoop:
    """Drives a :class:`pipeline.experiments.session.Session` step by step; collects metrics and check rows."""

    def __init__(
        self,
        session: Session,
        *,
        check_sync: str = "every",
        strict: bool = False,
        async_mode: bool = False,
        syncer: Any = None,
        checker: Callable[..., list[Any]] | None = None,
    ) -> None:
        from pipeline.sync.invariants import check_sync as check_invariants
        from pipeline.sync.weight_sync import WeightSync

        if check_sync not in CHECK_POLICIES:
            raise InputError(f"--check-sync must be one of {', '.join(CHECK_POLICIES)}, got {check_sync!r}")
        self.s = session
        self.check_sync = check_sync
        self.strict = strict
        self.async_mode = async_mode
        self.version = 0
        self.syncer = syncer if syncer is not None else WeightSync()
        self.checker = checker if checker is not None else check_invariants
        self._pending: Any = None  # Future of the next step's rollouts (async mode)
        self.on_check: Callable[[list[dict[str, Any]]], None] | None = None

    def initial_sync(self) -> list[dict[str, Any]]:
        """Push version 0 (the starting weights) and check it when checks are on."""
        with self.s.ranges.range("sync", step=-1, version=0):
            self._push(0)
            rows = self._check(-1, []) if self.check_sync != "off" else []
        return rows

    def _generate(self, step: int) -> tuple[list[Any], list[Rollout], SamplingParams]:
        problems, prompts = self.s.step_prompts(step)
        params = self.s.sampling_params(step)
        if not self.async_mode:
            return problems, self.s.sampler.generate(prompts, params), params
        if self._pending is None:
            self._pending = (problems, self.s.sampler.submit(prompts, params), params)
        problems, fut, params = self._pending
        rollouts = fut.result()
        next_problems, next_prompts = self.s.step_prompts(step + 1)
        next_params = self.s.sampling_params(step + 1)
        self._pending = (next_problems, self.s.sampler.submit(next_prompts, next_params), next_params)
        return problems, rollouts, params

    def _push(self, version: int) -> None:
        if version == 0 and self.s.sampler.weight_version >= 0:
            return
        self.syncer.sync(self.s.learner, self.s.sampler, version)

    def _check(self, step: int, rollouts: list[Rollout]) -> list[dict[str, Any]]:
        with self.s.ranges.range("sync/check", step=step, version=self.version):
            rows = self.checker(
                step, self.s.learner, self.s.sampler, rollouts=rollouts, report=self.syncer.last
            )
        return [r.as_dict() if hasattr(r, "as_dict") else dict(r) for r in rows]

    def step(self, step: int) -> StepResult:
        s = self.s
        rl = s.ranges
        t0 = time.monotonic_ns()
        with rl.range("step", step=step):
            with rl.range("generate", step=step) as g:
                problems, rollouts, params = self._generate(step)
                g["sequences"] = len(rollouts)
            rewards = [
                s.task.reward(p, s.tokenizer.decode(r.response_ids))
                for p, r in zip(problems, rollouts, strict=True)
            ]
            with rl.range("logprob", step=step) as lg:
                ids, am, rm = pad_sequences(
                    [r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts], s.pad_id
                )
                old_lp = s.learner.logprobs(ids, am).cpu()
                lg["tokens"] = int(am.sum())
            sampler_lp = place_logprobs(
                [len(r.prompt_ids) for r in rollouts], [r.logprobs for r in rollouts], rm.shape[1]
            )
            mm = mismatch_metrics(sampler_lp, old_lp, rm)
            batch = build_grpo_batch(rollouts, rewards, s.cfg.samples_per_prompt, old_lp, s.pad_id)
            with rl.range("update", step=step, precision=s.learner.precision) as u:
                stats = s.learner.train_step(batch, s.cfg.tokens_per_microbatch)
                u["microbatches"] = int(stats["num_microbatches"])
            self.version += 1
            check_rows: list[dict[str, Any]] = []
            t_check = 0
            with rl.range("sync", step=step, version=self.version):
                self._push(self.version)
                if self.check_sync == "every":  # "first": only the initial push (as verl PR #6666 does)
                    c0 = time.monotonic_ns()
                    check_rows = self._check(step, rollouts)
                    t_check = time.monotonic_ns() - c0
        wall = time.monotonic_ns() - t0
        phases: dict[str, int] = {}
        for r in rl.records:
            if r.attrs.get("step") == step and r.name != "step":
                phases[r.name] = phases.get(r.name, 0) + r.dur_ns
        failed = [r for r in check_rows if not r.get("passed", True)]
        metrics = {
            "step": step,
            "version": self.version,
            "step_s": _ns_to_s(wall),
            **{f"{k.replace('/', '_')}_s": _ns_to_s(v) for k, v in phases.items()},
            "sync_check_s": _ns_to_s(t_check),
            "sync_payload_bytes": int(self.syncer.last.payload_bytes) if self.syncer.last else 0,
            "reward_mean": float(torch.tensor(rewards).mean()),
            "exact_match": float(sum(r == 1.0 for r in rewards) / len(rewards)),
            "max_new_tokens": params.max_new_tokens,  # the step's cap (drawn when the run gives a range)
            "prompt_tokens": sum(len(r.prompt_ids) for r in rollouts),  # every sequence's prompt, as scored
            "response_tokens": int(rm.sum()),  # tokens the sampler generated (end-of-sequence included)
            "longest_response_tokens": max(len(r.response_ids) for r in rollouts),  # the batch's decode steps
            **mm,
            **{k: v for k, v in stats.items()},
            "checks_run": len(check_rows),
            "checks_failed": len(failed),
            "mixed_version_sequences": sum(len(r.weight_versions) > 1 for r in rollouts),
        }
        if failed and self.strict:
            first = failed[0]
            raise SyncCheckFailedError(
                f"sync check {first.get('invariant', '?')} failed at step {step}: {first.get('detail', '')} (--strict)"
            )
        return StepResult(metrics, check_rows)

    def close(self) -> None:
        if self._pending is not None:
            self._pending[1].result()
            self._pending = None
        close = getattr(self.s.sampler, "close", None)
        if close:
            close()


def evaluate_pairing(
    learner: Any, sampler: Any, prompts: list[list[int]], responses: list[list[int]], pad_id: int
) -> dict[str, float]:
    """Mismatch metrics at fixed weights on a fixed batch: the sampler scores the given responses with its
    own incremental decode (``Sampler.score``), the learner with its full-sequence forward."""
    lp_sampler = sampler.score(prompts, responses)
    ids, am, rm = pad_sequences(prompts, responses, pad_id)
    lp_learner = learner.logprobs(ids, am).cpu()
    lp_s = place_logprobs([len(p) for p in prompts], lp_sampler, rm.shape[1])
    out = mismatch_metrics(lp_s, lp_learner, rm)
    out["kl_k3_se"] = kl_k3_stderr(lp_s, lp_learner, rm)
    out["num_tokens"] = float(rm.sum())
    return out


def config_dict(cfg: Any) -> dict[str, Any]:
    return asdict(cfg)


__all__ = ["CHECK_POLICIES", "RLLoop", "SamplingParams", "SyncCheckFailedError", "evaluate_pairing"]
