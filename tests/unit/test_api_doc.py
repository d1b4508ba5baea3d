"""docs/api.md's example runs as written, from the repository root."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_api_doc_example_runs() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    (code,) = re.findall(r"## Example.*?```python\n(.*?)```", text, flags=re.S)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "busiest kernel class:" in out.stdout
    assert "tiny-dense" in out.stdout
