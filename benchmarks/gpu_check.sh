#!/usr/bin/env bash
# The device check, one script for the GPU and for CI:
#
#   bash benchmarks/gpu_check.sh [ROOT]        on a GPU (the device tool: results packed into $OUT), < 8 min
#   bash benchmarks/gpu_check.sh --smoke OUT   the same stages on the CPU with tiny shapes (CI), ~1.5-3 min
#
# Stages, each with its own time limit inside one overall budget (BUDGET_S), each logged to ROOT/logs/ and
# recorded in ROOT/stages.jsonl, each writing its outputs as it goes (a stage cut off by its limit leaves what it
# measured, and the stages after it still run on what exists):
#   env      python, torch, CUDA, GPU, driver, packages, which real GEMMs run here (env.json)
#   run      a short traced `mxperf run` (MXFP8 learner and sampler, every sync checked) on the device (run/)
#   sweep    BF16 vs fp8-tensor / fp8-rowwise / fp8-block128 learner updates over 6 micro-batch sizes, the last
#            repeat traced with CUPTI, rows written as they finish (sweep/)
#   ingest   the sweep's trace: GPU busy, host stall, kernels (ingest/)
#   fit      fixed + per-token cost, breakeven per FP8 id (fit/)
#   heldout  a new sweep at the predicted n* +- 25 % (or between measured sizes), compared with the fit (heldout/)
#
# Runs the repository with the machine's own python3 (PYTHON) and PYTHONPATH=. (no pip install; the GPU image
# has torch, transformers, pandas, pyarrow, scipy, matplotlib; msgspec and nvtx are optional).
set -uo pipefail
cd "$(dirname "$0")/.."

MODE=gpu
if [ "${1:-}" = "--smoke" ]; then
  MODE=smoke
  shift
  [ $# -ge 1 ] || { echo "usage: $0 --smoke OUT" >&2; exit 2; }
fi
PY="${PYTHON:-python3}"
[ "$MODE" = smoke ] && [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python  # CI: the venv
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 MXPERF_CACHE="${MXPERF_CACHE:-/tmp/mxperf-cache}"

if [ "$MODE" = smoke ]; then
  ROOT="$1"
  DEVICE=cpu MODEL=tiny-dense SEQ=16 SIZES=16,32,64 GLOBAL=64 REPEATS=2 WARMUP=0 BOOT=200 HELDOUT=1 THREADS=1
  RUN_ARGS=(--steps 2 --prompts-per-step 2 --samples-per-prompt 2 --max-new-tokens 3)
  # generous safety nets: on an idle 2-core CPU the smoke takes ~1.5 min, on a loaded shared one 2-3x that
  LIMITS=(env=60 run=150 sweep=240 ingest=120 fit=120 heldout=180)
  BUDGET_S="${BUDGET_S:-900}"
  export MXPERF_KINETO_DECODER=json  # the GPU image has no msgspec: take its ingest path here too
else
  ROOT="${1:-}"
  [ -z "$ROOT" ] && { [ -n "${OUT:-}" ] && ROOT=/tmp/gpu-check || ROOT=runs/gpu-check; }  # $OUT gets the archive
  DEVICE=cuda MODEL=qwen3-8b-2l SEQ=512 SIZES=512,1024,2048,4096,8192,16384 GLOBAL=16384 REPEATS=3 WARMUP=1
  BOOT=1000 HELDOUT=3 THREADS=8
  RUN_ARGS=(--steps 4 --prompts-per-step 8 --samples-per-prompt 4 --max-new-tokens 8)
  LIMITS=(env=45 run=75 sweep=200 ingest=60 fit=45 heldout=90)
  BUDGET_S="${BUDGET_S:-450}"
fi
PRECISIONS=bf16,fp8-tensor,fp8-rowwise,fp8-block128
mkdir -p "$ROOT/logs"
: >"$ROOT/stages.jsonl"
T0=$(date +%s)

limit_of() {
  local kv
  for kv in "${LIMITS[@]}"; do [ "${kv%%=*}" = "$1" ] && echo "${kv#*=}"; done
}

stage() {  # stage NAME CMD...: run with min(its limit, what is left of the budget); log and record it
  local name=$1
  shift
  local left=$((BUDGET_S - ($(date +%s) - T0)))
  local limit
  limit=$(limit_of "$name")
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    echo "{\"stage\": \"$name\", \"rc\": null, \"seconds\": 0, \"skipped\": \"budget spent\"}" >>"$ROOT/stages.jsonl"
    echo "[gpu_check] $name: skipped (budget spent)" >&2
    return
  fi
  local t=$(date +%s)
  echo "[gpu_check] $name (limit ${limit}s): $*" >&2
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$ROOT/logs/$name.log" 2>&1
  local rc=$?
  echo "{\"stage\": \"$name\", \"rc\": $rc, \"seconds\": $(($(date +%s) - t)), \"limit_s\": $limit}" >>"$ROOT/stages.jsonl"
  echo "[gpu_check] $name: rc $rc after $(($(date +%s) - t))s" >&2
  tail -n 3 "$ROOT/logs/$name.log" | cut -c1-300 >&2
}

stage env "$PY" benchmarks/gpu_check.py env --out "$ROOT/env.json"
if [ "$MODE" = gpu ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "[gpu_check] no CUDA device here ($ROOT/env.json says what there is); on a CPU run: $0 --smoke OUT" >&2
  exit 2
fi
stage run "$PY" -m mxperf run --device "$DEVICE" --threads "$THREADS" --model tiny-dense --learner mxfp8 --sampler mxfp8 \
  "${RUN_ARGS[@]}" --pretrain-steps 0 --trace -o "$ROOT/run" --force --json
stage sweep "$PY" -m mxperf sweep --device "$DEVICE" --threads "$THREADS" --model "$MODEL" --precisions "$PRECISIONS" \
  --tokens-per-microbatch "$SIZES" --seq-len "$SEQ" --global-batch "$GLOBAL" --repeats "$REPEATS" --warmup "$WARMUP" \
  --trace -o "$ROOT/sweep" --force --json
# the trace and the table, not the folder: a sweep cut off by its limit is 'interrupted' and keeps its rows
stage ingest "$PY" -m mxperf ingest "$ROOT/sweep/trace/rank-0.json.gz" -o "$ROOT/ingest" --force --json
stage fit "$PY" -m mxperf fit "$ROOT/sweep/microbatches.parquet" -o "$ROOT/fit" --bootstrap "$BOOT" --force --json
stage heldout "$PY" benchmarks/gpu_check.py heldout --sweep "$ROOT/sweep" --fit "$ROOT/fit" -o "$ROOT/heldout" \
  --repeats "$REPEATS" --max-precisions "$HELDOUT"
"$PY" benchmarks/gpu_check.py summary --root "$ROOT" >"$ROOT/logs/summary.log" 2>&1
echo "[gpu_check] done in $(($(date +%s) - T0))s: $ROOT/summary.json" >&2
if [ "$MODE" = gpu ] && [ -n "${OUT:-}" ]; then
  cat "$ROOT"/logs/*.log >"$OUT/gpu-check.log" 2>/dev/null
  "$PY" benchmarks/gpu_check.py pack --root "$ROOT" --dest "$OUT" >&2
fi
grep -qE '"rc": [1-9]|"skipped"' "$ROOT/stages.jsonl" && exit 1  # a stage failed, timed out or never ran
exit 0
