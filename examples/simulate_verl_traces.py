"""Writes a simulated verl FSDP actor's Kineto traces, one BF16 and one MXFP8, for examples/runs.

Simulated, not measured: ``tests/synthetic_traces.py`` builds the ops a verl actor update leaves (embedding and
GEMM ops with shapes, backward on the autograd thread, a ``loss.item()`` sync per micro-batch, dynamic batch
sizes) with costs whose breakeven is known; ``mxperf ingest`` then reads them with no labels, as it would a
real capture. Usage: ``python examples/simulate_verl_traces.py OUT_DIR`` -> OUT_DIR/{bf16,mxfp8}/prof_rank-0.json.gz
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import synthetic_traces as st

SIZES = (256, 512, 768, 1024, 1536, 2048, 3072, 4096)


def main(out: Path) -> None:
    rng = random.Random(5)
    steps = tuple(tuple(rng.choice(SIZES) for _ in range(4)) for _ in range(8))  # dynamic batching
    for k, precision in enumerate(("bf16", "mxfp8")):
        job = st.Job(framework="verl-fsdp", precision=precision, steps=steps, minibatches=2, seed=k)
        path = st.write_kineto(st.simulate(job), out / precision / "prof_rank-0.json.gz")
        print(path)
    truth = st.breakeven_tokens(st.Job(precision="bf16"), st.Job(precision="mxfp8"))
    print(f"built-in breakeven: {truth:.0f} tokens per micro-batch")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
