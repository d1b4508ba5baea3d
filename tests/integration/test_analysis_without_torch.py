"""Analysing someone's trace must not need a training stack: ingest, fit and the dashboard's loaders run in a
process where ``import torch`` / ``import transformers`` fail."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import DATA_DIR, REPO_ROOT

# A meta-path finder that refuses torch and transformers, as on a machine where they are not installed.
_BLOCK = (
    "import sys, importlib.abc\n"
    "class _NoTrainingStack(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name.split('.')[0] in ('torch', 'transformers'):\n"
    "            raise ModuleNotFoundError(f'No module named {name!r} (blocked by the test)')\n"
    "sys.meta_path.insert(0, _NoTrainingStack())\n"
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK + code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )


def test_torch_is_really_blocked_in_the_child() -> None:
    proc = _run("import torch")
    assert proc.returncode != 0 and "blocked by the test" in proc.stderr


def test_ingest_fit_and_dashboard_modules_work_without_torch(tmp_path: Path) -> None:
    trace = DATA_DIR / "real" / "hta_sampled_2rank" / "rank-0.json.gz"
    csv = DATA_DIR / "perfmodel" / "sim_no_stall.csv"
    code = (
        "from mxperf.cli import main; import dashboards.data, dashboards.charts, perfmodel.fitting.fit_all, tracing; "
        f"rc1 = main(['ingest', {str(trace)!r}, '-o', {str(tmp_path / 'ing')!r}, '--json']); "
        f"rc2 = main(['fit', {str(csv)!r}, '-o', {str(tmp_path / 'fit')!r}, '--json']); "
        "assert 'torch' not in sys.modules; "
        "sys.exit(rc1 or rc2)"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    ingest, fit = json.loads(lines[0]), json.loads(lines[-1])
    assert ingest["traces"][0]["devices"], "the GPU trace should give devices"
    assert fit["models"] and fit["models"][0]["fits"]["bf16"]["n_points"] >= 2
