"""Three GRPO steps with the Megatron learner and mxperf's native sampler, sync checks every step, in a child
process (the Megatron CPU compat layer patches torch.cuda process-wide). Writes JSON: check rows + metrics.

Usage: python tests/integration/megatron_child/rl_steps.py OUT.json STEPS [EXPORT_FAULT|-] [PRECISION]
(PRECISION: the learner's and the sampler's, bf16 or mxfp8)
"""

from __future__ import annotations

import json
import sys

import torch


def main(out_path: str, steps: int, fault: str | None, precision: str = "bf16") -> None:
    torch.set_num_threads(1)
    from pipeline.engines.factory import make_learner_backend
    from pipeline.engines.megatron.checks import check_sync_megatron
    from pipeline.experiments.loop import RLLoop
    from pipeline.experiments.session import RunConfig, Session
    from pipeline.learner.grpo import GRPOConfig

    # A short warm start gives partial rewards, so the GRPO steps have non-zero advantages.
    cfg = RunConfig(
        steps=max(steps, 1),
        prompts_per_step=4,
        samples_per_prompt=4,
        max_new_tokens=5,
        pretrain_steps=40,
        learner=precision,
        sampler=precision,
    )
    session = Session(cfg)
    session.learner = make_learner_backend(
        "megatron",
        model=session.learner.model,
        preset=session.preset,
        precision=cfg.learner,
        compute_dtype=cfg.compute_dtype,
        config=GRPOConfig(lr=cfg.lr, tis_cap=cfg.tis_cap),
        ranges=session.ranges,
        export_fault=fault,
    )
    loop = RLLoop(session, check_sync="every", checker=check_sync_megatron)
    rows = loop.initial_sync()
    metrics = []
    for step in range(steps):  # 0: the initial sync and its checks only
        result = loop.step(step)
        rows += result.check_rows
        metrics.append(result.metrics)
    loop.close()
    ranges = sorted({r.name for r in session.ranges.records})
    with open(out_path, "w") as f:
        json.dump({"rows": rows, "metrics": metrics, "ranges": ranges}, f, default=float)


if __name__ == "__main__":
    fault = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else None
    main(sys.argv[1], int(sys.argv[2]), fault, sys.argv[4] if len(sys.argv) > 4 else "bf16")
