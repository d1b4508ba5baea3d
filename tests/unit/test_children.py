"""A process mxperf forks (start-up decoder, background writer, sharded decoder) dies with the ingest that
started it, also when that one is killed with SIGKILL and no exit handler runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

# each script starts one child that would run for minutes, prints its pid, then waits to be killed
BACKGROUND_WRITER = """
import sys, time
from tracing.outputs import background

def parts():
    time.sleep(300)
    yield None

w = background.BackgroundWrite(parts, sys.argv[1] + "/events.parquet")
print(w._proc.pid, flush=True)
time.sleep(300)
"""
PREFETCH = """
import sys, time
from tracing.ingest import prefetch

assert prefetch.start(sys.argv[1] + "/fifo.json", False)  # the child blocks opening a FIFO nobody writes
(pid, _), = prefetch._PENDING.values()
print(pid, flush=True)
time.sleep(300)
"""


def _gone(pid: int, within: float = 15.0) -> bool:
    """True once ``pid`` has exited (no such process, or a zombie waiting for init to reap it)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


@linux_only
@pytest.mark.parametrize("script", [BACKGROUND_WRITER, PREFETCH], ids=["background-writer", "prefetch"])
def test_a_child_dies_with_its_killed_parent(script, tmp_path):
    os.mkfifo(tmp_path / "fifo.json")
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(parent.stdout.readline())
        assert not _gone(child, within=0.5), "the child should still be running while its parent is"
    finally:
        parent.kill()  # SIGKILL: no exit handler, no atexit
        parent.wait()
        parent.stdout.close()
    assert _gone(child), f"child {child} outlived its killed parent"
