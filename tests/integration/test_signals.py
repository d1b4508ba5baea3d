"""How the `mxperf` command ends when it is stopped from outside: SIGTERM (schedulers, `timeout`, `kill`) marks
the output `interrupted` and stops child processes; a closed pipe on stdout is not a traceback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
MXPERF = [sys.executable, "-m", "mxperf.cli"]


def _wait_for(predicate, timeout_s: float = 120.0) -> None:
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout_s, "timed out"
        time.sleep(0.2)


def _status(run: Path) -> str | None:
    try:
        return json.loads((run / "manifest.json").read_text())["status"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None


def test_sigterm_marks_a_run_interrupted_and_exits_143(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["run", "--steps", "500", "--pretrain-steps", "0", "--check-sync", "off", "-o", str(run)]
    proc = subprocess.Popen([*MXPERF, *args], env=ENV, stderr=subprocess.PIPE, text=True)
    # the run is under way, in its temp folder beside the output (the output appears when it ends)
    _wait_for(lambda: any(tmp_path.glob(".run.*/tokenizer.json")))
    assert not run.exists()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert err.strip().splitlines()[-1] == "mxperf run: terminated"
    assert _status(run) == "interrupted"


def test_sigterm_during_a_forced_rerun_keeps_the_old_output_and_sets_the_attempt_aside(
    tmp_path: Path,
) -> None:
    import pandas as pd

    from tracing.outputs import store
    from tracing.outputs.manifest import OutputDir

    run = tmp_path / "run"
    with OutputDir(run, kind="run", command=["earlier"]) as od:
        store.write_table(pd.DataFrame({"step": [0]}), od.path / store.METRICS)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    args = [
        "run",
        "--steps",
        "500",
        "--pretrain-steps",
        "0",
        "--check-sync",
        "off",
        "-o",
        str(run),
        "--force",
    ]
    proc = subprocess.Popen([*MXPERF, *args], env=ENV, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: any(tmp_path.glob(".run.*/tokenizer.json")))
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # the old output, untouched
    (aside,) = tmp_path.glob("run.interrupted-*")
    assert _status(aside) == "interrupted" and (aside / "tokenizer.json").exists()
    assert f"{run} is unchanged; this interrupted attempt is in {aside}" in err
    assert not list(tmp_path.glob(".run.*"))


def test_sigterm_to_mxperf_dash_stops_the_streamlit_server(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [*MXPERF, "dash", str(tmp_path), "--port", str(port)], env=ENV, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}/_stcore/health"

    def serving() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    _wait_for(serving)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    _wait_for(lambda: not serving(), timeout_s=15)  # the child server went with it


def test_a_closed_pipe_is_not_a_traceback(tmp_path: Path) -> None:
    real = ROOT / "tests" / "data" / "real" / "nsysai_h100x2_mfu_before.sqlite"  # ~3 MB of range rows
    out = tmp_path / "ing"
    subprocess.run([*MXPERF, "ingest", str(real), "-o", str(out)], env=ENV, check=True, capture_output=True)
    ranges = subprocess.Popen(
        [*MXPERF, "ranges", str(out), "--top", "0"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert ranges.stdout is not None
    ranges.stdout.readline()
    ranges.stdout.close()  # like `| head -1`
    _, err = ranges.communicate(timeout=60)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err
