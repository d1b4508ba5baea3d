"""Run a Megatron child script (``megatron_child/``) in its own process and read the JSON it writes.

The Megatron CPU compatibility layer patches ``torch.cuda`` process-wide, so these tests never import it here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_child(script: str, out: Path, *args: str, timeout: int = 300) -> dict:
    """``python megatron_child/<script> OUT ARGS...`` with one thread; returns the JSON written to ``out``."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests/integration/megatron_child" / script), str(out), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())
