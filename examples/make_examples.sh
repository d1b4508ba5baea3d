#!/usr/bin/env bash
# Regenerates examples/runs/ with mxperf's own commands (the commands listed in examples/runs/README.md).
# Run from the repository root after `make install`; about 10 minutes on 2 cores.
set -euo pipefail
M=.venv/bin/mxperf
O=examples/runs
export OMP_NUM_THREADS=1
for d in "$O"/*/; do rm -rf "$d"; done
$M run --model tiny-dense --learner bf16  --sampler bf16  --steps 5 -o $O/run-tiny-dense-bf16
$M run --model tiny-dense --learner mxfp8 --sampler mxfp8 --steps 5 -o $O/run-tiny-dense-mxfp8
$M run --model tiny-dense --learner mxfp8 --sampler bf16  --steps 5 -o $O/run-tiny-dense-mxfp8-learner-bf16-sampler
$M sweep --model tiny-dense --precisions bf16,mxfp8 --tokens-per-microbatch 128,256,512,1024 --repeats 3 \
    -o $O/sweep-tiny-dense
$M fit $O/sweep-tiny-dense $O/run-tiny-dense-bf16 -o $O/fit-tiny-dense
$M consistency --model tiny-dense -o $O/consistency-tiny-dense
$M faults --model tiny-dense --steps 2 -o $O/faults-tiny-dense
$M ingest tests/data/real/hta_a100_ddp_rank0_hostbound.json.gz -o $O/ingest-a100-hostbound
$M ingest tests/data/real/hta_sampled_2rank/rank-0.json.gz tests/data/real/hta_sampled_2rank/rank-1.json.gz \
    -o $O/ingest-2rank
$M ingest tests/data/real/nsysai_h100x2_mfu_before.sqlite -o $O/ingest-h100x2-nsys
# someone else's job without labels: simulated verl FSDP traces (truth built in), then metric logs (real key names)
SIM=$(mktemp -d)
.venv/bin/python examples/simulate_verl_traces.py "$SIM"
$M ingest "$SIM/bf16" -o $O/ingest-verl-sim-bf16
$M ingest "$SIM/mxfp8" -o $O/ingest-verl-sim-mxfp8
rm -rf "$SIM"
$M fit $O/ingest-verl-sim-bf16 $O/ingest-verl-sim-mxfp8 -o $O/fit-verl-sim
$M ingest tests/data/metric_logs/verl_grpo_bf16.jsonl -o $O/metrics-verl-bf16 --label model=qwen3-8b,precision=bf16
$M ingest tests/data/metric_logs/verl_grpo_mxfp8.jsonl -o $O/metrics-verl-mxfp8 --label model=qwen3-8b,precision=mxfp8
du -sh $O
