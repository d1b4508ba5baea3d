#!/usr/bin/env bash
# The device check: BF16 vs FP8 (fp8-tensor, fp8-rowwise via torch._scaled_mm) linear layers of a
# Qwen3-8B-shaped layer stack across micro-batch sizes, with Kineto traces. See benchmarks/gpu_sweep.py.
#
# Runs the repository as it is (PYTHONPATH=.) against the machine's own python and packages: no pip install,
# no nvtx package needed (the device image has torch 2.11 + CUDA 13 on Python 3.12). Bounded to < 8 minutes
# (timeout 450 s; the sweep itself stops starting new sizes after MAX_SECONDS).
#
#   bash benchmarks/gpu_sweep.sh [OUT_DIR]          # default: $OUT/gpu-sweep when $OUT is set, else runs/gpu-sweep
#   GPU_SWEEP_ARGS="--device cpu --model tiny-dense --tokens 32,64 --layers 1" bash benchmarks/gpu_sweep.sh DIR
#
# Afterwards, on a machine with the full install (pandas, pyarrow):
#   python benchmarks/gpu_sweep.py --finalize DIR                   # only if the image lacked pyarrow
#   mxperf ingest DIR/traces/*/rank-0.json.gz -o DIR-ingest --microbatch-range 'logprob/microbatch'
#   mxperf fit DIR -o DIR-fit --baseline bf16
set -euo pipefail

cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT_DIR="${1:-${OUT:+$OUT/gpu-sweep}}"
OUT_DIR="${OUT_DIR:-runs/gpu-sweep}"
MAX_SECONDS="${MAX_SECONDS:-360}"

echo "[gpu_sweep.sh] $(date -u +%FT%TZ) repo $(git rev-parse --short HEAD 2>/dev/null || echo '?') -> $OUT_DIR" >&2
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
"$PY" -c 'import sys, torch; print(f"[gpu_sweep.sh] python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, available {torch.cuda.is_available()}", file=sys.stderr)'

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MXPERF_GIT_SHA="$(git rev-parse HEAD 2>/dev/null || true)"
# shellcheck disable=SC2086  # GPU_SWEEP_ARGS is a list of flags
timeout 450 "$PY" benchmarks/gpu_sweep.py -o "$OUT_DIR" --max-seconds "$MAX_SECONDS" ${GPU_SWEEP_ARGS:-}
