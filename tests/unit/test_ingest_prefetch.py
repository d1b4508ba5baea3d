"""A Kineto file decoded by a forked child while ``mxperf ingest`` imports pandas gives the same tables."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from mxperf.commands import ingest_args
from tracing.ingest import kineto, prefetch
from tracing.outputs.errors import TraceFormatError

DATA = Path(__file__).parent.parent / "data"
A100 = DATA / "real" / "hta_a100_ddp_rank0_hostbound.json.gz"
ROOT = Path(__file__).resolve().parents[2]

needs_fork = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prefetch forks on Linux only")


@pytest.fixture
def forking(monkeypatch):
    """Let :func:`prefetch.start` fork here although pandas is imported (the CLI forks before it is)."""
    monkeypatch.setattr(prefetch, "enabled", lambda: True)
    yield
    prefetch.discard()


@needs_fork
def test_claimed_trace_equals_the_in_process_one(forking):
    assert prefetch.start(A100, False)
    got = kineto.load_kineto_events(A100)
    assert not prefetch._PENDING  # claimed
    want = kineto.load_kineto_events(A100)
    assert got.events.equals(want.events)
    assert (got.rank, got.meta, got.format) == (want.rank, want.meta, want.format)


@needs_fork
def test_other_options_or_a_changed_file_are_not_claimed(forking, tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(A100.read_bytes())
    assert prefetch.start(path, False)
    assert not prefetch.start(path, False)  # one child per file and options
    assert prefetch.claim(path, True) is None  # python functions kept: another table
    os.utime(path, ns=(1, 1))  # touched since the fork
    assert prefetch.claim(path, False) is None
    prefetch.discard()
    assert not prefetch._PENDING


@needs_fork
def test_an_interrupted_claim_leaves_no_child_running(forking, monkeypatch):
    """Ctrl-C while this process waits for the child's columns: the child is stopped and reaped, not left
    decoding (or a zombie) after ``mxperf ingest`` has said "interrupted"."""
    assert prefetch.start(A100, False)
    ((pid, _),) = prefetch._PENDING.values()

    def interrupted(src):
        raise KeyboardInterrupt

    monkeypatch.setattr(prefetch, "_receive", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prefetch.claim(A100, False)
    with pytest.raises(ChildProcessError):  # reaped: no such child any more
        os.waitpid(pid, os.WNOHANG)


@needs_fork
def test_a_bad_file_falls_back_to_the_exact_error(forking, tmp_path):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": "x"}]}'))
    assert prefetch.start(path, False)
    with pytest.raises(TraceFormatError, match=r"traceEvents\[0\]"):
        kineto.load_kineto_events(path)
    assert not prefetch._PENDING


@pytest.mark.parametrize(
    ("argv", "started"),
    [
        ([str(A100), "-o", "OUT"], True),
        ([str(A100), "-o", "OUT", "--python-functions", "--force"], True),
        ([str(A100), str(A100), "-o", "OUT"], False),  # several inputs
        ([str(A100), "-o", "OUT", "--workers", "2"], True),  # one file read in memory: in this process
        ([str(A100), "-o", "OUT", "--stream", "on"], False),
        ([str(A100), "-o", "OUT", "--ray", "local"], False),
        ([str(A100), "-o", "OUT", "--bogus"], False),  # the real parser reports it, not this one
        ([str(A100)], False),  # no -o
        ([str(DATA / "real" / "nsysai_h100x2_mfu_before.sqlite"), "-o", "OUT"], False),
        ([str(DATA / "real"), "-o", "OUT"], False),  # a directory
        (["-h"], False),
    ],
)
def test_start_prefetch_only_for_one_kineto_file_read_in_memory(monkeypatch, argv, started):
    calls = []
    monkeypatch.setattr(prefetch, "enabled", lambda: True)
    monkeypatch.setattr(prefetch, "start", lambda path, py: calls.append((Path(path), py)) or True)
    assert ingest_args.start_prefetch(argv) is started
    assert len(calls) == int(started)
    if started:
        assert calls[0] == (A100, "--python-functions" in argv)


def test_no_fork_once_pandas_is_imported():
    assert "pandas" in sys.modules
    assert not prefetch.enabled()
    assert not prefetch.start(A100, False)


@needs_fork
def test_no_fork_on_one_core():
    """With one usable core the import and the decoding would only take turns: the child is not started
    (checked in a fresh interpreter, before pandas, pinned to one CPU)."""
    code = (
        "import os; from tracing.ingest import prefetch; assert prefetch.enabled(), 'two cores';"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); print(prefetch.enabled())"
    )
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this machine gives the tests one core")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


@needs_fork
def test_whole_process_ingest_same_tables_with_and_without_prefetch(tmp_path):
    outs = {}
    for flag in ("1", "0"):
        out = tmp_path / f"out{flag}"
        env = {**os.environ, prefetch.ENV: flag}
        cmd = [sys.executable, "-m", "mxperf.cli", "ingest", str(A100), "-o", str(out)]
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        outs[flag] = (out, proc.stderr)
    (a, err_a), (b, err_b) = outs["1"], outs["0"]
    assert err_a == err_b
    tables = sorted(p.relative_to(a) for p in a.rglob("*.parquet"))
    assert tables == sorted(p.relative_to(b) for p in b.rglob("*.parquet"))
    assert len(tables) >= 6
    for t in tables:
        x, y = pd.read_parquet(a / t), pd.read_parquet(b / t)
        assert x.equals(y) and list(x.dtypes) == list(y.dtypes), t
